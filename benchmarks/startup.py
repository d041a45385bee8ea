"""How long the command line takes to answer when nothing needs to run: `autofit --help`, and a
configuration error (`autofit search model=nope`), each a fresh interpreter as a user starts it.

    python benchmarks/startup.py [--repeat 7]

Prints the median and the fastest of each, and the modules a configuration error imports that it
should not (torch, matplotlib, plotly, optuna, pandas); writes results/benchmarks/startup.json.
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

CASES = {
    "autofit --help": ["--help"],
    "autofit search model=nope": ["search", "model=nope"],
    "autofit report study=nope": ["report", "study=nope"],
}
HEAVY = ("torch", "matplotlib", "plotly", "optuna", "pandas", "diffusers", "transformers")


def time_once(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "autofit", *args], capture_output=True, check=False)
    return time.perf_counter() - started


def heavy_imports(args: list[str]) -> list[str]:
    """The heavy top-level packages a run of `autofit <args>` imported."""
    code = (
        "import sys; from autofit.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY:', *sorted(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    marked = [line for line in done.stderr.splitlines() if line.startswith("HEAVY:")]
    return marked[-1].split()[1:] if marked else ["(unknown: the run failed)"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    options = parser.parse_args()
    time_once(["--help"])  # the first run also fills the bytecode cache: not what users see
    rows = []
    for label, args in CASES.items():
        runs = [time_once(args) for _ in range(options.repeat)]
        row = {"command": label, "median_s": statistics.median(runs), "min_s": min(runs),
               "all_s": runs, "heavy_imports": heavy_imports(args)}  # fmt: skip
        rows.append(row)
        heavy = ", ".join(row["heavy_imports"]) or "none"
        print(f"{label:<28} median {row['median_s']:.2f} s  (min {row['min_s']:.2f} s, "
              f"{options.repeat} runs)  heavy imports: {heavy}")  # fmt: skip
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
