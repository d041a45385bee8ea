"""What a small simulated search costs from a fresh interpreter on a machine without a GPU, and
whether its parent process imports torch (`backend=auto` used to import it to learn there is no
GPU): `autofit search model=tiny_mlp gpu=a40 space=quick`, each run in a fresh folder.

    python benchmarks/search_start.py [--repeat 3] [--tree PATH ...]

Each `--tree` is a checkout of autofit whose package is put first on PYTHONPATH (default: this
one); give two, this one and another commit's worktree (`git worktree add /tmp/base <commit>`),
to compare them side by side in one run, interleaved. Prints the median wall and CPU seconds of
each; writes results/benchmarks/search_start.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["search", "model=tiny_mlp", "gpu=a40", "space=quick"]
# Run in the child: the search as the CLI runs it, then whether torch was imported.
CHILD = f"""
import runpy, sys
sys.argv = ["autofit", *{COMMAND!r}]
try:
    runpy.run_module("autofit", run_name="__main__")
except SystemExit:
    pass
print("parent imported torch:", "torch" in sys.modules, file=sys.stderr)
"""


def run_once(tree: Path) -> tuple[float, float, bool]:
    """Wall and CPU seconds of one search (the child and the probes it starts), and whether the
    search's own process imported torch."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", CHILD], cwd=folder, env=env, capture_output=True, text=True
        )
        wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"the search failed in {tree}: {done.stderr.strip().splitlines()[-1]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, "parent imported torch: True" in done.stderr


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tree", action="append", type=Path)
    args = parser.parse_args()
    trees = [t.resolve() for t in (args.tree or [ROOT])]
    runs: dict[str, list[tuple[float, float, bool]]] = {str(t): [] for t in trees}
    for _ in range(args.repeat):  # interleaved: a busy moment of the machine hits both alike
        for tree in trees:
            runs[str(tree)].append(run_once(tree))
    table = {}
    for tree, rows in runs.items():
        table[tree] = {
            "wall_s": statistics.median(r[0] for r in rows),
            "cpu_s": statistics.median(r[1] for r in rows),
            "parent_imports_torch": any(r[2] for r in rows),
        }
        t = table[tree]
        print(f"{tree}: {t['wall_s']:.2f} s wall, {t['cpu_s']:.2f} s CPU (median of {args.repeat}); "
              f"the search's process imports torch: {t['parent_imports_torch']}")  # fmt: skip
    out = Path("results") / "benchmarks" / "search_start.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": COMMAND, "trees": table}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
