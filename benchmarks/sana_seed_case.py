"""The Sana 1600M / A40 seed case: a full fine-tune with its companions on the GPU and an EMA copy.

    python benchmarks/sana_seed_case.py [--gpu a40] [--jobs N]

1. With the Gemma-2 2B text encoder and the DC-AE VAE online and an EMA copy on the GPU, at
   1024 px and batch 1: which optimizers and precisions fit.
2. From that run (bf16, AdamW), which single change brings the batch up, and by how much:
   cached encoders, an 8-bit optimizer, gradient checkpointing, EMA on the CPU; then all four.
   Each largest batch is found by the planner (exact: b* fits, b*+1 does not).

Every probe is simulated (the backend this machine picks); writes
results/benchmarks/sana_seed_case.json and prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from autofit.gpus import load_gpu
from autofit.knobs import REGISTRY
from autofit.models import load_preset
from autofit.probe.build import make_spec
from autofit.probe.launcher import launcher_for
from autofit.probe.runner import run_probe
from autofit.records.probe import Outcome
from autofit.search.planner import Observation, largest_fitting_batch
from autofit.units import size

MODEL = "sana_1600m"
SEED = {"resolution": 1024, "encoders": "online", "ema": "gpu", "batch_size": 1}
PRECISIONS = ["bf16", "fp16", "bf16_pure"]
OPTIMIZERS = REGISTRY["optimizer"].choices  # every optimizer the knob offers, in its order
CHANGES = [
    ("seed run (bf16, AdamW, encoders online, EMA on the GPU)", {}),
    ("encoders=cached", {"encoders": "cached"}),
    ("optimizer=adamw8bit", {"optimizer": "adamw8bit"}),
    ("checkpointing=true", {"checkpointing": True}),
    ("ema=cpu", {"ema": "cpu"}),
    (
        "all four",
        {"encoders": "cached", "optimizer": "adamw8bit", "checkpointing": True, "ema": "cpu"},
    ),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="a40")
    parser.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1))
    options = parser.parse_args()
    preset, gpu = load_preset(MODEL), load_gpu(options.gpu)

    with launcher_for("simulate", preset.family) as launcher:

        def probe(knobs: dict) -> object:
            return run_probe(
                make_spec(preset, gpu, {**SEED, **knobs}, backend="simulate"), launcher=launcher
            )

        grid = [{"precision": p, "optimizer": o} for p in PRECISIONS for o in OPTIMIZERS]
        with ThreadPoolExecutor(options.jobs) as pool:
            fits = list(pool.map(probe, grid))

        def largest(knobs: dict) -> dict:
            results: dict[int, object] = {}

            def observe(batch: int) -> Observation:
                result = probe(
                    {"precision": "bf16", "optimizer": "adamw", **knobs, "batch_size": batch}
                )
                results[batch] = result
                return Observation.of(batch, result)

            plan = largest_fitting_batch(observe, gpu.budget_bytes(0.05), max_batch=64)
            best = results.get(plan.best_batch) if plan.best_batch else None
            return {"best_batch": plan.best_batch, "probes": plan.probes, "peak_bytes": best.peak_bytes if best else None,
                    "samples_per_s": best.samples_per_s if best else None}  # fmt: skip

        with ThreadPoolExecutor(options.jobs) as pool:
            batches = list(pool.map(largest, [knobs for _, knobs in CHANGES]))

    budget = gpu.budget_bytes(0.05)
    print(
        f"Sana 1600M on {gpu.display}, budget {size(budget)}: encoders online, EMA on the GPU, 1024 px, batch 1\n"
    )
    print("| precision | optimizer | outcome | peak | phase | samples/s |")
    print("| --- | --- | --- | ---: | --- | ---: |")
    rows = []
    for knobs, result in zip(grid, fits, strict=True):
        note = result.outcome.value
        if result.outcome is Outcome.INVALID:
            note = f"invalid: {result.error['message']}"
        speed = f"{result.samples_per_s:.2f}" if result.samples_per_s else "-"
        print(
            f"| {knobs['precision']} | {knobs['optimizer']} | {note} | {size(result.peak_bytes)} | {result.phase or '-'} | {speed} |"
        )
        rows.append({**knobs, "outcome": result.outcome.value, "peak_bytes": result.peak_bytes, "phase": result.phase,
                     "samples_per_s": result.samples_per_s})  # fmt: skip
    print("\n| change from the seed run | largest batch | peak there | samples/s there | probes |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for (label, _), found in zip(CHANGES, batches, strict=True):
        speed = f"{found['samples_per_s']:.2f}" if found["samples_per_s"] else "-"
        print(
            f"| {label} | {found['best_batch'] or 'none fits'} | {size(found['peak_bytes'])} | {speed} | {found['probes']} |"
        )
    out = Path("results/benchmarks")
    out.mkdir(parents=True, exist_ok=True)
    (out / "sana_seed_case.json").write_text(
        json.dumps(
            {
                "gpu": gpu.name,
                "budget_bytes": budget,
                "fits_at_batch_1": rows,
                "largest_batch": [
                    {"change": label, **found}
                    for (label, _), found in zip(CHANGES, batches, strict=True)
                ],
            },
            indent=2,
        )  # fmt: skip
    )


if __name__ == "__main__":
    main()
