"""How long one simulated probe takes, subprocess included.

    python benchmarks/probe_speed.py [--repeat 3] [--model flux_dev ...]

For each case it times `run_probe` (the worker process: interpreter start, imports, model build on
fake tensors, two training steps, allocator replay) and the whole `autofit probe` command (adds
Hydra composition and the CLI), and writes the figures to results/benchmarks/probe_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from autofit.gpus import load_gpu
from autofit.models import load_preset
from autofit.probe import run_probe
from autofit.probe.build import make_spec

CASES = [
    # (model, gpu, knobs): Sana as in the probe issue; Flux.1-dev at 1024 px and Llama 3 8B at
    # 4096 tokens, the largest image and language presets, as LoRA runs (how they are trained on
    # one GPU)
    (
        "sana_1600m",
        "a40",
        {"batch_size": 1, "resolution": 1024, "precision": "bf16", "optimizer": "adamw"},
    ),
    (
        "flux_dev",
        "h100_80",
        {"batch_size": 1, "resolution": 1024, "precision": "bf16", "train_mode": "lora"},
    ),
    (
        "llama3_8b",
        "h100_80",
        {"batch_size": 1, "resolution": 4096, "precision": "bf16", "train_mode": "lora"},
    ),
]


def time_probe(model: str, gpu: str, knobs: dict) -> tuple[float, str]:
    spec = make_spec(load_preset(model), load_gpu(gpu), knobs, backend="simulate")
    started = time.perf_counter()
    result = run_probe(spec)
    return time.perf_counter() - started, result.outcome.value


def time_cli(model: str, gpu: str, knobs: dict, out: Path) -> float:
    args = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in knobs.items()]
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "autofit", "probe", f"model={model}", f"gpu={gpu}", "backend=simulate",
         *args, f"out={out}"],
        check=True, capture_output=True,
    )  # fmt: skip
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--model", nargs="*", default=None, help="only these cases (default: all)")
    options = parser.parse_args()
    out_dir = Path("results/benchmarks")
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for model, gpu, knobs in CASES:
        if options.model and model not in options.model:
            continue
        probes, outcomes = zip(
            *(time_probe(model, gpu, knobs) for _ in range(options.repeat)), strict=True
        )
        clis = [
            time_cli(model, gpu, knobs, out_dir / "probe_speed_result.json")
            for _ in range(options.repeat)
        ]
        row = {
            "model": model,
            "gpu": gpu,
            "knobs": knobs,
            "outcome": outcomes[0],
            "probe_s": {"median": statistics.median(probes), "min": min(probes), "all": probes},
            "cli_s": {"median": statistics.median(clis), "min": min(clis), "all": clis},
        }
        rows.append(row)
        print(
            f"{model:<12} {gpu:<8} {row['outcome']:<4} probe {row['probe_s']['median']:6.2f} s "
            f"(min {row['probe_s']['min']:.2f})   autofit probe {row['cli_s']['median']:6.2f} s "
            f"(min {row['cli_s']['min']:.2f})   median of {options.repeat}"
        )
    machine = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    (out_dir / "probe_speed.json").write_text(
        json.dumps({"machine": machine, "cases": rows}, indent=2)
    )


if __name__ == "__main__":
    main()
