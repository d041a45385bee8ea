"""The planner against bisection on wide batch ranges, probe for probe, on simulated probes.

    python benchmarks/planner_wide.py [--max-batch 1000000] [--case tiny_mlp:l4 ...]

For each case (model and GPU, bf16_pure and AdamW at the preset's native resolution) it finds the
largest batch in 1..max that fits the budget (5% margin) twice: with the planner that `autofit
search` uses for backends that measure batch by batch (autofit/search/planner.py), and with plain
bisection (probe the middle of what is left, 1 + 2 + ... halvings). Both ask the same simulated
probes, which are deterministic, so a batch the other already probed is not probed again; the
count is of the batches each one asked. The two answers must agree. Writes
results/benchmarks/planner_wide.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from autofit.backends import resolve
from autofit.gpus import load_gpu
from autofit.models import load_preset
from autofit.probe.launcher import launcher_for
from autofit.search.planner import Observation, largest_fitting_batch
from autofit.search.prober import Prober
from autofit.search.recorder import StudyRecorder

OUT = Path("results/benchmarks")
MARGIN = 0.05
CASES = ["tiny_mlp:l4", "tiny_mlp:a40", "tiny_sana:l4", "tiny_sana:a40"]
KNOBS = {"precision": "bf16_pure", "optimizer": "adamw"}


def bisection(fits: Callable[[int], bool], max_batch: int) -> tuple[int | None, list[int]]:
    """The largest batch in 1..max_batch that fits, by halving what is left: ceil(log2(max+1))
    probes."""
    lo, hi, asked = 0, max_batch + 1, []
    while hi - lo > 1:
        middle = (lo + hi) // 2
        asked.append(middle)
        if fits(middle):
            lo = middle
        else:
            hi = middle
    return (lo or None), asked


def one_case(model: str, gpu_name: str, max_batch: int, folder: Path) -> dict:
    preset, gpu = load_preset(model), load_gpu(gpu_name)
    backend = resolve("simulate", gpu, gpu.budget_bytes(MARGIN))
    recorder = StudyRecorder(f"sqlite:///{folder / 'planner_wide.db'}", f"{model}-{gpu_name}", {})
    seen: dict[int, Observation] = {}
    with launcher_for(backend, preset.family) as launcher:
        prober = Prober(preset, gpu, backend, MARGIN, 900, recorder, launcher, scan=False)

        def observe(batch: int) -> Observation:
            if batch not in seen:
                knobs = {**KNOBS, "resolution": preset.resolution, "batch_size": batch}
                seen[batch] = Observation.of(batch, prober(knobs)[0])
            return seen[batch]

        started = time.perf_counter()
        plan = largest_fitting_batch(observe, prober.budget, max_batch)
        wall = time.perf_counter() - started
        bisected, asked = bisection(lambda b: bool(observe(b).fits), max_batch)
    recorder.close()
    if plan.best_batch != bisected:
        raise SystemExit(f"{model} on {gpu_name}: planner {plan.best_batch}, bisection {bisected}")
    return {
        "model": model,
        "gpu": gpu_name,
        "max_batch": max_batch,
        "largest_batch": plan.best_batch,
        "planner_probes": plan.probes,
        "planner_batches": [o.batch for o in plan.observations],
        "bisection_probes": len(asked),
        "planner_wall_s": round(wall, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-batch", type=int, default=1_000_000)
    parser.add_argument("--case", action="append", help="model:gpu (repeatable)")
    options = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for case in options.case or CASES:
            model, gpu = case.split(":")
            rows.append(one_case(model, gpu, options.max_batch, Path(folder)))
            print(json.dumps(rows[-1]), flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "planner_wide.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("\n| model | GPU | batch range | largest batch | planner probes | bisection probes |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for row in rows:
        print(f"| {row['model']} | {row['gpu']} | 1..{row['max_batch']} | {row['largest_batch']} "
              f"| {row['planner_probes']} | {row['bisection_probes']} |")  # fmt: skip


if __name__ == "__main__":
    main()
