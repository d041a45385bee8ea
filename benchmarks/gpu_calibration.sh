#!/usr/bin/env bash
# Real CUDA runs against the simulator on a lent GPU, in one call, each step time-boxed:
#   benchmarks/gpu_calibration.sh SECONDS [ROW ...]
# 1. the `cuda`-marked tests;
# 2. a real `autofit search backend=cuda` of a small space on a real preset (SEARCH, default
#    `model=sana_600m gpu=rtx4090 space=quick`: a 24 GB card emulated by capping the H100's
#    allocator), then its best run re-probed at b* and b*+1 in fresh processes;
# 3. the published rows named (most informative first), each simulated and run for real on its own
#    card, emulated (`autofit calibrate set=published rerun=true`), until SECONDS have passed;
#    then the calibration sets named by SETS (default none), likewise.
# Everything goes to $OUT (default results/gpu_calibration): log.txt as it runs, and run.tar.gz
# (the CSVs, the study and the logs) rewritten after each step, so a killed run keeps what it did.
# Rows also stay in calibration/ (a rerun resumes where the last one stopped).
#
# MEASURE=cpu dry-runs the script on a machine without a GPU: tiny models, the rows listed only.
# On a machine whose Python lacks autofit's dependencies, wheels in .whl/ are installed first into
# /tmp/site (see docs/calibrate.md, "Calibrating on a GPU").
set -u
budget=${1:-480}
shift || true
rows=("$@")
measure=${MEASURE:-cuda}
start=$(date +%s)
out=${OUT:-results/gpu_calibration}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HYDRA_FULL_ERROR=0
log="$out/log.txt"
: >"$log"

python=${PYTHON:-python3}
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    rm -rf /tmp/site
    $python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl 2>&1 | tail -3 | tee -a "$log"
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
left() { echo $((budget - ($(date +%s) - start))); }
# Time-boxed: at most $1 seconds, never past the budget.
box() { local cap=$1; shift; local l; l=$(left); [ "$l" -lt "$cap" ] && cap=$l; [ "$cap" -gt 5 ] || return 124; timeout --kill-after=10 "$cap" "$@"; }
keep() {  # everything so far into one archive (a killed run keeps it); no probe outlives a step
    pkill -9 -f "[-]m autofit" 2>/dev/null; pkill -9 -f "[-]m pytest" 2>/dev/null
    mkdir -p results/gpu_run && cp "$log" results/gpu_run/log.txt
    tar -czf "$out/run.tar.gz.tmp" $(ls -d calibration/h100_80*.csv calibration/h100_80*.json \
        results/gpu_search results/gpu_probes results/gpu_run results/probes 2>/dev/null) 2>/dev/null
    mv -f "$out/run.tar.gz.tmp" "$out/run.tar.gz"
}
step() { echo; echo "== $* ($(left) s left)"; }

{
    step environment
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
    $python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
    # Every library a probe imports, before any probe: a missing one fails here in seconds.
    $python -c "import diffusers, transformers, peft, optuna, hydra, bitsandbytes, deepspeed, came_pytorch, lion_pytorch; from diffusers import SanaTransformer2DModel; print('imports ok', diffusers.__version__, transformers.__version__, peft.__version__, bitsandbytes.__version__)"
} 2>&1 | tee -a "$log"
grep -q "imports ok" "$log" || { keep; exit 1; }

if [ "$measure" = cuda ]; then
    search=${SEARCH:-model=sana_600m gpu=rtx4090 space=quick}
    tests=(tests/test_cuda_backend.py tests/test_endings.py tests/test_calibrate.py)
else
    search=${SEARCH:-model=tiny_sana gpu=rtx4090 space=quick}
    tests=(tests/test_calibrate.py)
fi

{
    step "1. the cuda-marked tests"
    box 100 $python -m pytest -q -p no:cacheprovider -m cuda "${tests[@]}" 2>&1 | tail -25
} 2>&1 | tee -a "$log"
keep

{
    step "2. autofit search backend=$measure $search"
    rm -rf results/gpu_search results/gpu_probes
    box 150 $python -m autofit search $search backend=$measure study=gpu_search 2>&1 | tail -30
    step "2b. its best re-probed at b* and b*+1"
    if [ -f results/gpu_search/best.yaml ]; then
        mkdir -p results/gpu_probes
        for more in 0 1; do
            # best.yaml's settings, batch b*+more: the same run in a fresh process
            words=$($python -c "
import sys, yaml
best = yaml.safe_load(open('results/gpu_search/best.yaml'))
best['batch_size'] = int(best['batch_size']) + $more
print(' '.join(f'{k}={str(v).lower() if isinstance(v, bool) else v}' for k, v in best.items()))")
            echo "autofit probe $words backend=$measure"
            box 60 $python -m autofit probe $words backend=$measure \
                2>&1 | tee "results/gpu_probes/b_plus_$more.txt" | tail -8
        done
    else
        echo "no best.yaml: the search did not finish"
    fi
} 2>&1 | tee -a "$log"
keep

if [ ${#rows[@]} -gt 0 ]; then
    only=$(IFS=,; echo "[${rows[*]}]")
    {
        step "3. published rows $only"
        if [ "$measure" = cuda ]; then
            box 100000 $python -m autofit calibrate set=published rerun=true measure=cuda \
                "only=$only" timeout_s=150 2>&1 | grep -v "^\s*$" | tail -60
        else
            $python -m autofit calibrate set=published rerun=true measure=cpu "only=$only" dry_run=true
        fi
    } 2>&1 | tee -a "$log"
    keep
fi

for set in ${SETS:-}; do
    {
        step "4. calibration set $set"
        box 100000 $python -m autofit calibrate gpu=h100_80 measure="$measure" set="$set" \
            timeout_s=150 2>&1 | grep -v "^\s*$" | tail -40
    } 2>&1 | tee -a "$log"
    keep
done
step done | tee -a "$log"
keep
