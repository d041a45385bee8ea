"""What a search's fork server gains by freezing what it imported (gc.freeze) before it forks.

    python benchmarks/forked_scan.py [--repeat 3]

A parent imports what a search's fork server imports for Sana 1600M (the worker, the simulate
backend and the Sana workload, with every library diffusers pulls in), then forks children that
each scan one group of structures (1024 px, bf16, AdamW, 8-bit AdamW and CAME over batches 1-64),
as a search's scans run. It does so twice, in fresh interpreters, alternating: once as it is and
once after `gc.freeze()`, and prints each child's wall time and CPU time (user and system), and
writes results/benchmarks/forked_scan.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import gc, json, os, resource, sys, time
import autofit.probe.worker, autofit.backends.simulate, autofit.workloads.sana
from autofit.gpus import load_gpu
from autofit.models import load_preset
from autofit.probe.build import make_spec
from autofit.fastpath.scan import scan_group

def spec(**knobs):
    knobs = {"resolution": 1024, "precision": "bf16", "optimizer": "adamw", "batch_size": 1, **knobs}
    return make_spec(load_preset("sana_1600m"), load_gpu("a40"), knobs, backend="simulate")

items = [(spec(), 1), (spec(optimizer="adamw8bit"), 1), (spec(optimizer="came"), 1)]
if sys.argv[1] == "frozen":
    gc.freeze()
started, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
pid = os.fork()
if pid == 0:
    scan_group(items, 64)
    os._exit(0)
os.waitpid(pid, 0)
after = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({
    "wall_s": time.perf_counter() - started,
    "user_s": after.ru_utime - before.ru_utime,
    "system_s": after.ru_stime - before.ru_stime,
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"as imported": [], "frozen": []}
    for _ in range(options.repeat):
        for name in runs:
            done = subprocess.run(
                [sys.executable, "-c", CHILD, "frozen" if name == "frozen" else "plain"],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            runs[name].append(json.loads(done.stdout.splitlines()[-1]))
    for name, figures in runs.items():
        wall = statistics.median(f["wall_s"] for f in figures)
        cpu = statistics.median(f["user_s"] + f["system_s"] for f in figures)
        system = statistics.median(f["system_s"] for f in figures)
        print(
            f"{name:<12} scan child: wall {wall:5.2f} s, CPU {cpu:5.2f} s (system {system:.2f} s), "
            f"medians of {options.repeat}"
        )
    out = Path("results/benchmarks")
    out.mkdir(parents=True, exist_ok=True)
    (out / "forked_scan.json").write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
