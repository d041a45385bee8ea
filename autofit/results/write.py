"""What a search writes into its results folder: the four files, together or not at all."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from autofit.command_line import command, key_of, override
from autofit.errors import AutofitError
from autofit.host import budget_words
from autofit.knobs import that_matter
from autofit.models import ModelPreset
from autofit.paths import search_spaces_dir, write_together
from autofit.probe.summary import headroom, provenance
from autofit.records.probe import ProbeResult
from autofit.records.status import Status
from autofit.results.layout import (
    BEST,
    GIB,
    HOST_COLUMNS,
    PARETO,
    RESULTS,
    SUMMARY,
    TRIALS,
    study_folder,
)
from autofit.results.schema import SCHEMA_VERSION
from autofit.search.pareto import BestRule, run_size
from autofit.units import size


def point(result: ProbeResult) -> dict[str, Any]:
    """A fitting run as the summary lists it."""
    return {
        "config": result.config,
        "peak_bytes": result.peak_bytes,
        "samples_per_s": result.samples_per_s,
        "step_time_s": result.step_time_s,
        "run_size": run_size(result),
        "breakdown": result.breakdown,
        "host_peak_bytes": result.host_peak_bytes,
        "host_pinned_bytes": result.host_pinned_bytes,
    }


def write_results(
    out: Path,
    meta: dict[str, Any],
    results: list[ProbeResult],
    combinations: list[Any],
    pareto: list[ProbeResult],
    best: ProbeResult | None,
    counts: dict[str, Any],
    knob_names: list[str],
    fastest: ProbeResult | None = None,
    rule: BestRule | None = None,
    preset: ModelPreset | None = None,
) -> dict[str, Any]:
    """Write the four files of a search into `out`, together or not at all (summary.json, the
    folder's commit marker, last: autofit/paths.py write_together); return the summary.
    `combinations` are the search's (each with knobs, resolution, status, best_batch, probes and
    reason). `rule` chose `best`; `fastest`: the fastest run, where the rule preferred another.
    `preset`, the model searched: best.yaml lists only the knobs that matter for its best run
    (every knob where it is not given)."""
    budget = int(counts["budget_bytes"])
    trials, trial_rows = _trials_text(results, combinations, budget, knob_names)
    pareto_csv = _pareto_text(pareto, knob_names)
    summary = {
        "schema_version": SCHEMA_VERSION,
        **meta,
        **counts,
        "best": point(best) if best else None,
        "best_rule": asdict(rule) if rule else None,
        "fastest": point(fastest) if fastest else None,
        "pareto": [point(r) for r in pareto],
        "combinations": [c.to_dict() for c in combinations],
        # What the tables beside it hold, so a reader can tell a complete file from a cut one.
        "files": {TRIALS: {"rows": trial_rows}, PARETO: {"rows": len(pareto)}, BEST: {}},
        "rerun": rerun_command(meta, out),
    }
    if best is None:
        smallest = min((r.peak_bytes for r in results if r.peak_bytes), default=None)
        summary["nothing_fits"] = {"smallest_peak_bytes": smallest}
    files = {
        TRIALS: trials,
        PARETO: pareto_csv,
        BEST: _best_text(best, meta, fastest is not None, preset),
        SUMMARY: json.dumps(summary, indent=2),
    }
    try:
        write_together(out, files, marker=SUMMARY)
    except OSError as exc:
        raise AutofitError(f"cannot write the results to {out}: {exc.strerror or exc}") from None
    return summary


def rerun_command(meta: dict[str, Any], folder: Path) -> str:
    """The `autofit search` line that writes this study's folder again, as it runs pasted into a
    shell in the folder the search ran in (autofit/command_line.py): the settings as the user
    gave them (`overrides`), the study, its storage and the folder. A folder written before
    autofit kept them: made from its meta, the settings it does not keep (target.*, timeout_s,
    a field of the model or GPU) left at their defaults."""
    given = _given(meta)
    if given is None:
        settings = {"model": meta.get("model"), "gpu": meta.get("gpu")}
        settings |= {"space": _searched_space(meta)}
        settings |= {key: meta.get(key) for key in ("margin", "trainer")}
        given = [override(key, value) for key, value in settings.items() if value is not None]
    # The backend the search ran on, not `auto`: on another machine auto may choose another.
    given = [o for o in given if key_of(o) != "backend"]
    place: dict[str, Any] = {"backend": meta.get("backend"), "study": meta.get("study") or None}
    storage = meta.get("storage")
    if storage and storage != f"sqlite:///{RESULTS / 'studies.db'}":
        place["storage"] = storage
    if not place["study"] or Path(folder) != study_folder(str(place["study"])):
        place["out"] = str(folder)
    located = [override(key, value) for key, value in place.items() if value is not None]
    return command(["autofit", "search", *given, *located])


def probe_words(meta: dict[str, Any]) -> list[str]:
    """The overrides that name a study's model and GPU for `autofit probe`: as the search was
    given them (a model.entry, a GPU file, a field of either included), else by name."""
    given = _given(meta)
    if given is None:
        return [override("model", meta["model"]), override("gpu", meta["gpu"])]
    return [o for o in given if key_of(o).split(".")[0] in ("model", "gpu")]


def _given(meta: dict[str, Any]) -> list[str] | None:
    given = meta.get("overrides")
    if isinstance(given, list) and all(isinstance(o, str) for o in given):
        return given
    return None


def _searched_space(meta: dict[str, Any]) -> str | None:
    """The `space=` of a study written before autofit kept its overrides: a space file's stem;
    a file of that name here is the one searched."""
    name = meta.get("space")
    if name and not (search_spaces_dir() / f"{name}.yaml").is_file():
        if Path(f"{name}.yaml").is_file():
            return f"{name}.yaml"
    return name


def _csv_text(columns: list[str], rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _trials_text(
    results: list[ProbeResult],
    combinations: list[Any],
    budget: int,
    knob_names: list[str],
) -> tuple[str, int]:
    """trials.csv's text and its number of rows."""
    columns = ["outcome", "resolution", "batch_size", *knob_names, "peak_gib", "peak_bytes",
               "budget_bytes", *HOST_COLUMNS, "samples_per_s", "step_time_s", "phase", "backend",
               "source", "reason"]  # fmt: skip
    rows = [
        {
            **result.config,
            "outcome": result.outcome.value,
            "peak_gib": round(result.peak_bytes / GIB, 3) if result.peak_bytes else "",
            "peak_bytes": result.peak_bytes or "",
            "budget_bytes": result.budget_bytes,
            **_host_cells(result),
            "samples_per_s": result.samples_per_s or "",
            "step_time_s": result.step_time_s or "",
            "phase": result.phase or "",
            "backend": result.backend,
            "source": result.origin,
            "reason": (result.error or {}).get("message", ""),
        }
        for result in results
    ]
    rows += [
        {
            **combination.knobs,
            "outcome": combination.status.value,
            "resolution": combination.resolution,
            "budget_bytes": budget,
            "reason": combination.reason,
        }
        for combination in combinations
        if combination.status in (Status.PRUNED, Status.INVALID)
    ]
    return _csv_text(columns, rows), len(rows)


def _host_cells(result: ProbeResult) -> dict[str, Any]:
    """A result's host memory as trials.csv and pareto.csv write it (empty when not counted)."""
    peak = result.host_peak_bytes
    return {
        "host_peak_gib": round(peak / GIB, 3) if peak is not None else "",
        "host_peak_bytes": peak if peak is not None else "",
        "host_pinned_bytes": result.host_pinned_bytes
        if result.host_pinned_bytes is not None
        else "",
        "host_budget_bytes": result.host_budget_bytes or "",
    }


def _pareto_text(pareto: list[ProbeResult], knob_names: list[str]) -> str:
    columns = ["resolution", "batch_size", *knob_names, "run_size", "samples_per_s", "peak_gib",
               "peak_bytes", "host_peak_gib", "host_peak_bytes", "host_pinned_bytes"]  # fmt: skip
    rows = [
        {
            **result.config,
            "run_size": run_size(result),
            "samples_per_s": result.samples_per_s,
            "peak_gib": round((result.peak_bytes or 0) / GIB, 3),
            "peak_bytes": result.peak_bytes,
            **_host_cells(result),
        }
        for result in pareto
    ]
    return _csv_text(columns, rows)


def _best_text(
    best: ProbeResult | None, meta: dict[str, Any], preferred: bool, preset: ModelPreset | None
) -> str:

    if best is None:
        return f"# Nothing fits {meta['gpu']} in this space: no best configuration.\n"
    how = "estimated" if best.throughput_estimated else "measured"
    host = (
        f"; host {size(best.host_peak_bytes)} of {budget_words(best.host_budget_bytes)}"
        if best.host_peak_bytes is not None
        else ""
    )
    # A knob that does nothing for this run (a LoRA rank in a full fine-tune) would read as if
    # it did: left out, it runs at its default, which changes nothing here.
    knobs = that_matter(best.config, preset) if preset is not None else best.config
    probe = [*probe_words(meta), *(override(k, v) for k, v in knobs.items())]
    which = "nearly fastest, with more headroom," if preferred else "fastest"
    header = (
        f"# The {which} configuration of {meta['model']} that fits {meta['gpu']}: peak "
        f"{size(best.peak_bytes)} of a {size(best.budget_bytes)} budget "
        f"({headroom(best.peak_bytes or 0, best.budget_bytes)}), "
        f"{best.samples_per_s:.3f} samples/s ({provenance(best.backend)}, {how}){host}.\n"
        f"# Re-measure it with: {command(['autofit', 'probe', *probe])}\n"
    )
    body = {"model": meta["model"], "gpu": meta["gpu"], **knobs}
    return header + yaml.safe_dump(body, sort_keys=False)
