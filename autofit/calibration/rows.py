"""One calibration row per case (the simulated probe next to the measured one), and the figures
that say how far the simulator is from the real runs."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import Any

from autofit.knobs import registry
from autofit.records.probe import Outcome, ProbeResult

FIXED_COLUMNS = ["case", "model", "target", "local_gpu", "emulated", "measure"]
RESULT_COLUMNS = [
    "sim_outcome", "sim_peak_bytes", "sim_reserved_bytes", "sim_allocated_bytes", "sim_samples_per_s",
    "real_outcome", "real_peak_bytes", "real_reserved_bytes", "real_allocated_bytes", "real_samples_per_s",
    "sim_context_bytes", "real_context_bytes",
    "peak_error", "allocated_error", "throughput_error", "sim_phase", "real_phase", "real_error",
    "torch", "cuda", "driver", "device",
]  # fmt: skip


def columns() -> list[str]:
    return [*FIXED_COLUMNS, *registry(), *RESULT_COLUMNS]


def _relative(simulated: float | None, measured: float | None) -> float | None:
    if simulated is None or not measured:
        return None
    return simulated / measured - 1.0


def row(
    case_key: str,
    model: str,
    target: str,
    local_device: str,
    measure: str,
    emulated: bool,
    simulated: ProbeResult,
    measured: ProbeResult,
    environment: dict[str, str],
) -> dict[str, Any]:
    """Errors are signed (simulated / measured - 1): positive means the simulator over-estimates.
    Memory is compared where both runs fitted; throughput only where the run was on the target
    GPU itself (an A40 emulated on an H100 runs at the H100's speed, and the CPU's speed says
    nothing of a GPU's)."""
    both_ok = simulated.outcome is Outcome.OK and measured.outcome is Outcome.OK
    same_speed = both_ok and measure == "cuda" and not emulated
    config = measured.config or simulated.config
    return {
        "case": case_key, "model": model, "target": target, "local_gpu": local_device,
        "emulated": emulated, "measure": measure,
        **{name: config.get(name) for name in registry()},
        "sim_outcome": simulated.outcome.value, "sim_peak_bytes": simulated.peak_bytes,
        "sim_reserved_bytes": simulated.peak_reserved_bytes,
        "sim_allocated_bytes": simulated.peak_allocated_bytes, "sim_samples_per_s": simulated.samples_per_s,
        "real_outcome": measured.outcome.value, "real_peak_bytes": measured.peak_bytes,
        "real_reserved_bytes": measured.peak_reserved_bytes,
        "real_allocated_bytes": measured.peak_allocated_bytes, "real_samples_per_s": measured.samples_per_s,
        # The CUDA context is outside the allocator: measured here, an estimate in the GPU entry.
        "sim_context_bytes": (simulated.overhead_detail or {}).get("cuda_context"),
        "real_context_bytes": (measured.overhead_detail or {}).get("cuda_context"),
        "peak_error": _relative(simulated.peak_bytes, measured.peak_bytes) if both_ok else None,
        "allocated_error": (
            _relative(simulated.peak_allocated_bytes, measured.peak_allocated_bytes) if both_ok else None
        ),
        "throughput_error": (
            _relative(simulated.samples_per_s, measured.samples_per_s) if same_speed else None
        ),
        "sim_phase": simulated.phase, "real_phase": measured.phase,
        "real_error": (measured.error or {}).get("message", ""),
        **{k: environment.get(k, "") for k in ("torch", "cuda", "driver", "device")},
    }  # fmt: skip


def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def write_rows(path: Path, fieldnames: list[str], rows: list[dict[str, Any]]) -> None:
    """A whole CSV, written to a temporary file then renamed: a reader never sees half of it."""
    temporary = path.with_name(path.name + ".tmp")
    with temporary.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fieldnames, restval="")
        writer.writeheader()
        writer.writerows(rows)
    temporary.replace(path)


def append_row(path: Path, values: dict[str, Any]) -> None:
    """One row, flushed as soon as its case is done: a killed calibration keeps what it measured.

    A file begun by an autofit with fewer knobs keeps its rows: when this row has columns the
    file's header lacks, the file is rewritten once with the wider header (to a temporary file,
    then renamed), the old rows' new cells empty."""
    row = {k: "" if v is None else v for k, v in values.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    header: list[str] = []
    if path.exists() and path.stat().st_size:
        with path.open(newline="") as handle:
            header = list(csv.DictReader(handle).fieldnames or [])
    if not header or set(row) - set(header):
        wider = [*header, *(c for c in [*columns(), *row] if c not in header)]
        write_rows(path, wider, read_rows(path))
        header = wider
    with path.open("a", newline="") as handle:
        csv.DictWriter(handle, fieldnames=header, restval="").writerow(row)


def _errors(rows: list[dict[str, str]], column: str) -> list[float]:
    return [float(r[column]) for r in rows if r.get(column) not in (None, "")]


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0, "median_abs": None, "max_abs": None, "mean_signed": None}
    absolute = [abs(v) for v in values]
    return {
        "n": len(values),
        "median_abs": statistics.median(absolute),
        "max_abs": max(absolute),
        "mean_signed": statistics.fmean(values),
    }


def answered(r: dict[str, str]) -> bool:
    """Whether both runs of a row said fits or does not fit (not a crash or a timeout)."""
    return r["sim_outcome"] in ("ok", "oom") and r["real_outcome"] in ("ok", "oom")


def figures(rows: list[dict[str, str]]) -> dict[str, Any]:
    """The calibration's verdict: peak and throughput errors, and how often the two backends
    disagree on fitting. A false fit (simulated ok, real oom) is the costly miss: the user's run
    crashes; a false oom only leaves a larger batch on the table."""

    return {
        "cases": len(rows),
        "peak": _stats(_errors(rows, "peak_error")),
        "allocated": _stats(_errors(rows, "allocated_error")),
        "throughput": _stats(_errors(rows, "throughput_error")),
        "false_fits": [r["case"] for r in rows if r["sim_outcome"] == "ok" and r["real_outcome"] == "oom"],
        "false_ooms": [r["case"] for r in rows if r["sim_outcome"] == "oom" and r["real_outcome"] == "ok"],
        "unanswered": [
            f"{r['case']}: simulated {r['sim_outcome']}, real {r['real_outcome']}"
            for r in rows if not answered(r)
        ],
    }  # fmt: skip


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def describe(result: dict[str, Any]) -> str:
    """The figures as the lines `autofit calibrate` prints and the README quotes."""
    lines = []
    for label, key in (
        ("peak_bytes", "peak"),
        ("allocated peak", "allocated"),
        ("throughput", "throughput"),
    ):
        stats = result[key]
        lines.append(
            f"{label:<15} median |error| {percent(stats['median_abs'])}, max {percent(stats['max_abs'])}, "
            f"mean signed {percent(stats['mean_signed'])} over {stats['n']} cases"
        )  # fmt: skip
    lines.append(
        f"{'fit verdicts':<15} {len(result['false_fits'])} false fits (simulated ok, real oom), "
        f"{len(result['false_ooms'])} false ooms, of {result['cases']} cases"
    )
    lines += [f"  false fit: {case}" for case in result["false_fits"]]
    lines += [f"  false oom: {case}" for case in result["false_ooms"]]
    lines += [f"  not compared: {line}" for line in result["unanswered"]]
    return "\n".join(lines)
