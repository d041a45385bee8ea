#!/usr/bin/env bash
# Real CUDA probes against the simulator on a lent GPU, in one call:
#   benchmarks/gpu_calibration.sh SECONDS [SET ...]
# runs `autofit calibrate measure=cuda` over each calibration set, then the `cuda`-marked tests,
# until SECONDS have passed. Rows go to calibration/<gpu>[-<set>].csv (kept: a rerun resumes where
# the last one stopped) and are copied to $OUT when it is set, with the logs.
#
# On a machine whose Python lacks autofit's dependencies, wheels in .whl/ are installed first into
# /tmp/site (see docs/calibrate.md, "Calibrating on a GPU").
set -u
budget=${1:-540}
shift || true
sets=("${@:-default}")
start=$(date +%s)
out=${OUT:-results/gpu_calibration}
mkdir -p "$out"
export PYTHONUNBUFFERED=1

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    rm -rf /tmp/site
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
python=${PYTHON:-python3}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    $python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
    # Every library a probe imports, before any probe: a missing one fails here in seconds.
    $python -c "import diffusers, transformers, peft, optuna, hydra, bitsandbytes; from diffusers import SanaTransformer2DModel; print('imports ok')"
} 2>&1 | tee "$out/environment.txt"
grep -q "imports ok" "$out/environment.txt" || exit 1

left() { echo $((budget - ($(date +%s) - start))); }

for set in "${sets[@]}"; do
    [ "$(left)" -gt 30 ] || break
    name=h100_80
    [ "$set" = default ] || name="h100_80-$set"
    timeout "$(left)" $python -m autofit calibrate gpu=h100_80 measure=cuda set="$set" \
        2>&1 | tee "$out/calibrate-$set.log" | grep -v "^\s*$" | tail -80
    cp "calibration/$name.csv" "$out/" 2>/dev/null
    cp "calibration/$name.json" "$out/" 2>/dev/null
done

# The GPU tests last: they take about two minutes, the calibration rows matter more.
[ "$(left)" -gt 150 ] && timeout "$(left)" $python -m pytest -q -p no:cacheprovider -m cuda tests 2>&1 | tee "$out/cuda_tests.log" | tail -15
