"""The whole published set (calibration/published.csv) against the simulator, and whether it meets
the bounds the tests hold a subset of it to.

    python benchmarks/published_set.py [--max-median 0.05] [--max-error 0.15]

Runs `autofit calibrate set=published` (every expressible row simulated with its closest knobs,
compared like with like; each class's margin derived from the errors, calibration/margins.yaml),
then checks the figures it wrote, for the held-out rows and for all of them: median |error|,
largest |error|, mean signed error within +-3%, no false fit at each class's margin, at most one
false out-of-memory per 20 verdicts, and the roofline's median |error| against the published
speeds. Exits 1 when a bound is broken, naming it. About 10 minutes on two cores.
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
    parser.add_argument("--max-mean", type=float, default=0.03)
    parser.add_argument("--max-throughput-median", type=float, default=0.20)
    args = parser.parse_args()

    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "autofit", "calibrate", "set=published", f"out={OUT}"], check=False
    )
    if done.returncode:
        return done.returncode
    figures = json.loads(OUT.with_suffix(".json").read_text())["figures"]
    broken = [f"{kind}: {why}" for kind in ("held_out", "all")
              for why in _broken(figures if kind == "all" else figures[kind], args)]  # fmt: skip
    if (figures["throughput_median_abs"] or 0) > args.max_throughput_median:
        broken.append(
            f"throughput median |error| {figures['throughput_median_abs']:.1%} > "
            f"{args.max_throughput_median:.0%}"
        )
    if figures["crashed"]:
        broken.append(f"crashed: {'; '.join(figures['crashed'])}")
    print(f"\n{time.perf_counter() - started:.0f} s; " + ("bounds broken: " + "; ".join(broken)
                                                         if broken else "every bound met"))  # fmt: skip
    return 1 if broken else 0


def _broken(figures: dict, args: argparse.Namespace) -> list[str]:
    """The bounds one kind of rows (held out, or all) breaks."""
    broken = []
    if figures["compared"] and figures["median_abs"] > args.max_median:
        broken.append(f"median |error| {figures['median_abs']:.1%} > {args.max_median:.0%}")
    if figures["compared"] and figures["max_abs"] > args.max_error:
        broken.append(f"max |error| {figures['max_abs']:.1%} > {args.max_error:.0%}")
    if figures["compared"] and abs(figures["mean_signed"]) > args.max_mean:
        broken.append(
            f"mean signed error {figures['mean_signed']:+.1%} beyond +-{args.max_mean:.0%}"
        )
    if figures["false_fits"]:
        broken.append(f"false fits: {', '.join(figures['false_fits'])}")
    if len(figures["false_ooms"]) * 20 > max(figures["verdicts"], 20):
        broken.append(f"{len(figures['false_ooms'])} false ooms in {figures['verdicts']} verdicts: "
                      + ", ".join(figures["false_ooms"]))  # fmt: skip
    return broken


if __name__ == "__main__":
    raise SystemExit(main())
