"""What one traced step costs with autofit's use of the fake dispatch cache, against FakeTensorMode's.

    python benchmarks/trace_speed.py [--model sana_1600m] [--batch 64] [--resolution 1024]
        [--repeat 5]

In one process, after one untimed trace (imports, the cache filled): a scan's trace of the
model's two steps (autofit/fastpath/scan.py TracedPoint: model built, setup, updates, the pass,
priced) at the batch given, alternately with RealLayoutFakeMode's key and outputs from the
cache (autofit/simulator/kernel_outputs.py) and with FakeTensorMode's, which the mode then
inherits.
Prints the median of each and checks that both traces record the same step: the same record a
batch curve reads (autofit/fastpath/batch_curve.py `record`: every allocation event, each run
of frees in one order, every size, kernel and figure of the price). Writes results/benchmarks/trace_speed-<model>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from torch._subclasses.fake_tensor import FakeTensorMode

from autofit.fastpath.scan import TracedPoint
from autofit.gpus import load_gpu
from autofit.models import load_preset
from autofit.probe.build import make_spec
from autofit.probe.worker import versions
from autofit.simulator.kernel_outputs import RealLayoutFakeMode

# RealLayoutFakeMode's own ways with the dispatch cache
CACHE_METHODS = ("_prep_args_for_hash", "_get_output_tensor_from_cache_entry")
OURS = {name: getattr(RealLayoutFakeMode, name) for name in CACHE_METHODS}
THEIRS = {name: getattr(FakeTensorMode, name) for name in CACHE_METHODS}


def traced(spec, found, methods) -> tuple[float, TracedPoint]:  # noqa: ANN001
    for name, method in methods.items():
        setattr(RealLayoutFakeMode, name, method)
    try:
        started = time.perf_counter()
        point = TracedPoint(spec, found)
        return time.perf_counter() - started, point
    finally:
        for name, method in OURS.items():
            setattr(RealLayoutFakeMode, name, method)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="sana_1600m")
    parser.add_argument("--gpu", default="a40")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--resolution", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=5)
    options = parser.parse_args()
    preset = load_preset(options.model)
    knobs = {"batch_size": options.batch, "resolution": options.resolution}
    spec = make_spec(preset, load_gpu(options.gpu), knobs, backend="simulate")
    found = versions()
    keys = {"FakeTensorMode's cache": THEIRS, "autofit's": OURS}
    traced(spec, found, OURS)  # imports and the first fill of the cache, untimed
    times: dict[str, list[float]] = {name: [] for name in keys}
    points: dict[str, TracedPoint] = {}
    for _ in range(options.repeat):
        for name, key in keys.items():
            seconds, points[name] = traced(spec, found, key)
            times[name].append(seconds)
    theirs, ours = (points[name] for name in keys)
    same = (
        (theirs.record.structure, theirs.record.parts, theirs.record.rates)
        == (ours.record.structure, ours.record.parts, ours.record.rates)
        and theirs.record.numbers.tolist() == ours.record.numbers.tolist()
        and theirs.cost == ours.cost
    )
    for name, figures in times.items():
        print(
            f"{name:<22} {statistics.median(figures):5.2f} s a trace (median of {options.repeat})"
        )
    print("the same step recorded:", "yes" if same else "NO")
    out = Path("results/benchmarks")
    out.mkdir(parents=True, exist_ok=True)
    data = {"model": options.model, "knobs": knobs, "seconds": times, "same_step": same}
    (out / f"trace_speed-{options.model}.json").write_text(json.dumps(data, indent=2))
    if not same:
        raise SystemExit("the two recorded different steps")


if __name__ == "__main__":
    main()
