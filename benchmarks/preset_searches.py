"""`autofit search space=quick` on every model preset, each against a GPU it fits, timed.

    python benchmarks/preset_searches.py [--model flux_dev ...] [--jobs N]

Each search is the command a user types, run as a fresh process on simulated probes, with its own
study (and its own Optuna storage) under results/benchmarks/preset_searches/<model>/. Prints a Markdown table (probes, wall
time, the best config and its peak against the budget) and writes
results/benchmarks/preset_searches.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

OUT = Path("results/benchmarks/preset_searches")

# Each preset against a GPU its quick-space run fits. Full fine-tuning with AdamW costs 16 bytes
# per parameter before activations, which sets the smallest GPU for the larger models; the quick
# space trains Flux and the language models as LoRA.
TARGETS = {
    "sana_600m": "a10g",
    "sana_1600m": "a40",
    "sd35_medium": "a100_80",
    "sd35_large": "h200",
    "sd3_controlnet": "a100_80",
    "flux_dev": "a40",
    "sdxl": "a100_80",
    "llama3_8b": "a40",
    "qwen2_5_7b": "a40",
}

BYTES_PER_GIB = 2**30


def run_search(model: str, gpu: str, jobs: int | None) -> dict:
    out = OUT / model
    shutil.rmtree(out, ignore_errors=True)  # a fresh study: every probe runs, none is reused
    out.mkdir(parents=True)
    args = [
        f"model={model}",
        f"gpu={gpu}",
        "space=quick",
        "backend=simulate",
        f"out={out}",
        f"storage=sqlite:///{out / 'study.db'}",
    ]
    if jobs:
        args.append(f"jobs={jobs}")
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "autofit", "search", *args], capture_output=True, text=True
    )
    wall = time.perf_counter() - started
    row = {"model": model, "gpu": gpu, "exit": done.returncode, "wall_s": round(wall, 1)}
    summary_path = out / "summary.json"
    if not summary_path.exists():
        row["error"] = done.stderr.strip().splitlines()[-1:] or ["no summary written"]
        return row
    summary = json.loads(summary_path.read_text())
    best = summary.get("best") or {}
    row.update(
        n_probes=summary["n_probes"],
        budget_gib=round(summary["budget_bytes"] / BYTES_PER_GIB, 2),
        best=best.get("config"),
        best_peak_gib=round(best["peak_bytes"] / BYTES_PER_GIB, 2) if best else None,
        best_samples_per_s=best.get("samples_per_s"),
    )
    return row


def describe(config: dict | None) -> str:
    if not config:
        return "nothing fits"
    keys = ("batch_size", "resolution", "train_mode", "checkpointing")
    return " ".join(f"{k}={config[k]}" for k in keys if k in config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="*", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--jobs", type=int, default=None, help="probes in parallel (default: auto)")
    options = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    print("| model | gpu | probes | wall | best | peak / budget | exit |")
    print("|---|---|---|---|---|---|---|")
    for model in options.model:
        row = run_search(model, TARGETS[model], options.jobs)
        rows.append(row)
        peak = (
            f"{row.get('best_peak_gib')} / {row.get('budget_gib')} GiB"
            if "n_probes" in row
            else "-"
        )
        best = describe(row.get("best")) if "n_probes" in row else row.get("error")
        print(
            f"| {model} | {row['gpu']} | {row.get('n_probes', '-')} | {row['wall_s']:.0f} s "
            f"| {best} | {peak} | {row['exit']} |",
            flush=True,
        )
    machine = {"cpus": os.cpu_count(), "python": platform.python_version()}
    (OUT.parent / "preset_searches.json").write_text(
        json.dumps({"machine": machine, "searches": rows}, indent=2)
    )
    if any(row["exit"] != 0 for row in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
