"""What a search leaves behind in its results folder: summary.json, trials.csv, pareto.csv and
best.yaml. Machine-readable first; the CLI prints the same figures."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from autofit.probe.spec import ProbeResult
from autofit.search.engine import SearchResult
from autofit.search.pareto import run_size
from autofit.units import size, value

GIB = 1 << 30


def point(result: ProbeResult) -> dict[str, Any]:
    """A fitting run as the summary lists it."""
    return {
        "config": result.config,
        "peak_bytes": result.peak_bytes,
        "samples_per_s": result.samples_per_s,
        "step_time_s": result.step_time_s,
        "run_size": run_size(result),
        "breakdown": result.breakdown,
    }


def write_outputs(
    out: Path, search: SearchResult, meta: dict[str, Any], knob_names: list[str]
) -> dict[str, Any]:
    """Write the four files into `out`; return the summary."""
    out.mkdir(parents=True, exist_ok=True)
    pareto = [point(r) for front in search.pareto.values() for r in front]
    summary = {
        **meta,
        "budget_bytes": search.budget_bytes,
        "n_probes": search.new_probes + search.reused_probes,
        "new_probes": search.new_probes,
        "reused_probes": search.reused_probes,
        "wall_s": round(search.wall_s, 2),
        "best": point(search.best) if search.best else None,
        "pareto": pareto,
        "combinations": [c.to_dict() for c in search.combinations],
    }
    if search.best is None:
        smallest = min((r.peak_bytes for r in search.results if r.peak_bytes), default=None)
        summary["nothing_fits"] = {"smallest_peak_bytes": smallest}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    _write_trials(out / "trials.csv", search, knob_names)
    _write_pareto(out / "pareto.csv", search, knob_names)
    _write_best(out / "best.yaml", search.best, meta)
    return summary


def _write_trials(path: Path, search: SearchResult, knob_names: list[str]) -> None:
    columns = ["outcome", "resolution", "batch_size", *knob_names, "peak_gib", "peak_bytes",
               "budget_bytes", "samples_per_s", "step_time_s", "phase", "backend", "reason"]  # fmt: skip
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        for result in search.results:
            writer.writerow(
                {
                    **result.config,
                    "outcome": result.outcome.value,
                    "peak_gib": round(result.peak_bytes / GIB, 3) if result.peak_bytes else "",
                    "peak_bytes": result.peak_bytes or "",
                    "budget_bytes": result.budget_bytes,
                    "samples_per_s": result.samples_per_s or "",
                    "step_time_s": result.step_time_s or "",
                    "phase": result.phase or "",
                    "backend": result.backend,
                    "reason": (result.error or {}).get("message", ""),
                }
            )
        for combination in search.combinations:
            if combination.status in ("pruned", "invalid"):
                writer.writerow(
                    {
                        **combination.knobs,
                        "outcome": combination.status,
                        "resolution": combination.resolution,
                        "budget_bytes": search.budget_bytes,
                        "reason": combination.reason,
                    }
                )


def _write_pareto(path: Path, search: SearchResult, knob_names: list[str]) -> None:
    columns = [
        "resolution",
        "batch_size",
        *knob_names,
        "run_size",
        "samples_per_s",
        "peak_gib",
        "peak_bytes",
    ]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        for front in search.pareto.values():
            for result in front:
                writer.writerow(
                    {
                        **result.config,
                        "run_size": run_size(result),
                        "samples_per_s": result.samples_per_s,
                        "peak_gib": round((result.peak_bytes or 0) / GIB, 3),
                        "peak_bytes": result.peak_bytes,
                    }
                )


def _write_best(path: Path, best: ProbeResult | None, meta: dict[str, Any]) -> None:
    import yaml

    if best is None:
        path.write_text(f"# Nothing fits {meta['gpu']} in this space: no best configuration.\n")
        return
    how = "estimated" if best.throughput_estimated else "measured"
    header = (
        f"# The fastest configuration of {meta['model']} that fits {meta['gpu']}: peak "
        f"{size(best.peak_bytes)} of a {size(best.budget_bytes)} budget, "
        f"{best.samples_per_s:.3f} samples/s ({best.backend}, {how}).\n"
        f"# Re-measure it with: autofit probe model={meta['model']} gpu={meta['gpu']} "
        + " ".join(f"{k}={value(v)}" for k, v in best.config.items())
        + "\n"
    )
    body = {"model": meta["model"], "gpu": meta["gpu"], **best.config}
    path.write_text(header + yaml.safe_dump(body, sort_keys=False))
