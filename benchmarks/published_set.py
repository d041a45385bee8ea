"""The whole published set (calibration/published.csv) against the simulator, and whether it meets
the bounds the tests hold a subset of it to.

    python benchmarks/published_set.py [--max-median 0.05] [--max-error 0.15]

Runs `autofit calibrate set=published` (every expressible row simulated with its closest knobs,
compared like with like), then checks the figures it wrote: median |error|, largest |error|, no
false fit at the default margin, and the roofline's median |error| against the published speeds. Exits 1 when a bound is broken, naming it. About 8 minutes on
two cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

OUT = Path("results") / "benchmarks" / "published_set.csv"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-median", type=float, default=0.05)
    parser.add_argument("--max-error", type=float, default=0.15)
    parser.add_argument("--max-throughput-median", type=float, default=0.20)
    args = parser.parse_args()

    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "autofit", "calibrate", "set=published", f"out={OUT}"], check=False
    )
    if done.returncode:
        return done.returncode
    figures = json.loads(OUT.with_suffix(".json").read_text())["figures"]
    broken = []
    if figures["median_abs"] > args.max_median:
        broken.append(f"median |error| {figures['median_abs']:.1%} > {args.max_median:.0%}")
    if figures["max_abs"] > args.max_error:
        broken.append(f"max |error| {figures['max_abs']:.1%} > {args.max_error:.0%}")
    if (figures["throughput_median_abs"] or 0) > args.max_throughput_median:
        broken.append(
            f"throughput median |error| {figures['throughput_median_abs']:.1%} > "
            f"{args.max_throughput_median:.0%}"
        )
    if figures["false_fits"]:
        broken.append(f"false fits: {', '.join(figures['false_fits'])}")
    if figures["crashed"]:
        broken.append(f"crashed: {'; '.join(figures['crashed'])}")
    print(f"\n{time.perf_counter() - started:.0f} s; " + ("bounds broken: " + "; ".join(broken)
                                                         if broken else "every bound met"))  # fmt: skip
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
