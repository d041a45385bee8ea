"""The simulator as it is now against GPU runs measured earlier: each real row of a calibration CSV
simulated again, without a GPU.

    python benchmarks/resimulate.py [calibration/h100_80-core.csv ...]

A calibration CSV (`autofit calibrate measure=cuda`) keeps the real run's figures beside the
simulated ones of the day it ran. After a change to the simulator, this re-runs the simulated side
of every row whose real run finished and prints, per row, the simulated peak and samples/s then
and now against the measured ones, and the median |error| of each. Throughput is compared only
where the run was on the target GPU itself (not emulated).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from autofit.calibration.rows import read_rows
from autofit.gpus import load_gpu
from autofit.knobs import parse_all, registry
from autofit.models import load_preset
from autofit.probe.build import make_spec
from autofit.probe.runner import run_probe
from autofit.units import parsed_value


def _knobs(row: dict[str, str]) -> dict[str, object]:
    """The row's knob columns, typed back from the CSV's text."""
    return parse_all(
        {name: parsed_value(row[name]) for name in registry() if row.get(name, "") != ""}
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="*", type=Path, default=[Path("calibration/h100_80-core.csv")])
    parser.add_argument("--margin", type=float, default=0.05)
    args = parser.parse_args()

    errors: dict[str, list[float]] = {
        "peak then": [],
        "peak now": [],
        "speed then": [],
        "speed now": [],
    }
    print("case | real peak | sim then | sim now | real samples/s | sim then | sim now")
    for path in args.csv:
        for row in read_rows(path):
            if row.get("measure") != "cuda" or row["real_outcome"] != "ok":
                continue
            spec = make_spec(
                load_preset(row["model"]), load_gpu(row["target"]), _knobs(row), "simulate",
                args.margin, 900,
            )  # fmt: skip
            now = run_probe(spec)
            real_peak, then_peak = int(row["real_peak_bytes"]), int(row["sim_peak_bytes"])
            errors["peak then"].append(then_peak / real_peak - 1)
            errors["peak now"].append(now.peak_bytes / real_peak - 1)
            speeds = "-"
            if row["emulated"] != "True":
                real, then = float(row["real_samples_per_s"]), float(row["sim_samples_per_s"])
                errors["speed then"].append(then / real - 1)
                errors["speed now"].append(now.samples_per_s / real - 1)
                speeds = f"{real:.3f} | {then:.3f} ({then / real - 1:+.1%}) | {now.samples_per_s:.3f} ({now.samples_per_s / real - 1:+.1%})"
            gib = 2**30
            print(
                f"{row['case']} | {real_peak / gib:.2f} GiB | {then_peak / gib:.2f} "
                f"({then_peak / real_peak - 1:+.1%}) | {now.peak_bytes / gib:.2f} "
                f"({now.peak_bytes / real_peak - 1:+.1%}) | {speeds}",
                flush=True,
            )
    for name, values in errors.items():
        if values:
            absolute = [abs(v) for v in values]
            print(
                f"{name:10} median |error| {statistics.median(absolute):.1%}, max {max(absolute):.1%} over {len(values)} rows"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
