"""How long the command line takes to answer when nothing needs to run: `autofit --help`, and a
configuration error (`autofit search model=nope`), each a fresh interpreter as a user starts it.

    python benchmarks/startup.py [--repeat 7] [--against PATH]

Prints the median and the fastest of each, wall and CPU (the child's user and system time), and
the modules a configuration error imports that it should not (torch, matplotlib, plotly, optuna,
pandas); writes results/benchmarks/startup.json. `--against PATH` runs the same commands from
another checkout (e.g. a `git worktree` of an older commit) interleaved with this one's, run for
run, so that both see the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = {
    "autofit --help": ["--help"],
    "autofit search model=nope": ["search", "model=nope"],
    "autofit report study=nope": ["report", "study=nope"],
}
HEAVY = ("torch", "matplotlib", "plotly", "optuna", "pandas", "diffusers", "transformers")


def time_once(args: list[str], tree: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one `autofit <args>`, the code of checkout `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "autofit", *args], capture_output=True, check=False, cwd=tree, env=env
    )  # fmt: skip
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def heavy_imports(args: list[str], tree: Path) -> list[str]:
    """The heavy top-level packages a run of `autofit <args>` imported."""
    code = (
        "import sys; from autofit.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY:', *sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)"
    )
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=tree, env=env
    )  # fmt: skip
    marked = [line for line in done.stderr.splitlines() if line.startswith("HEAVY:")]
    return marked[-1].split()[1:] if marked else ["(unknown: the run failed)"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--against", type=Path, help="another checkout, timed interleaved")
    options = parser.parse_args()
    trees = {"this": Path.cwd()} | (
        {"against": options.against.resolve()} if options.against else {}
    )
    for tree in trees.values():
        time_once(["--help"], tree)  # the first run also fills the bytecode cache
    times: dict[tuple[str, str], list[tuple[float, float]]] = {
        (name, label): [] for name in trees for label in CASES
    }
    for _ in range(options.repeat):
        for label, args in CASES.items():
            for name, tree in trees.items():
                times[(name, label)].append(time_once(args, tree))
    rows = []
    for (name, label), runs in times.items():
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        row = {"tree": name, "path": str(trees[name]), "command": label,
               "median_s": statistics.median(walls), "min_s": min(walls),
               "median_cpu_s": statistics.median(cpus), "all_s": walls, "all_cpu_s": cpus,
               "heavy_imports": heavy_imports(CASES[label], trees[name])}  # fmt: skip
        rows.append(row)
        heavy = ", ".join(row["heavy_imports"]) or "none"
        print(f"{name:<8} {label:<28} median {row['median_s']:.3f} s wall, "
              f"{row['median_cpu_s']:.3f} s CPU (min {row['min_s']:.3f} s, {options.repeat} runs)"
              f"  heavy imports: {heavy}")  # fmt: skip
    out = Path("results/benchmarks")
    out.mkdir(parents=True, exist_ok=True)
    machine = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    (out / "startup.json").write_text(json.dumps({"machine": machine, "cases": rows}, indent=2))


if __name__ == "__main__":
    main()
