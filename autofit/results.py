"""A study's results folder, `results/<study>/`: what a search writes there, what report and export
read back, and how any command finds it. The one place its layout is known.

- `summary.json`: study, model, gpu, backend, space, margin, budget, host budget
  (`host_budget_bytes`, null when not stated), probe counts, wall time, the best run and the
  Pareto front (each run with `config` holding every knob as applied, its GPU and host peaks),
  and every combination with its status (`Status`) and largest fitting batch or why it has none;
- `trials.csv`: every probe (its outcome, an `Outcome`) and every pruned or invalid combination
  (its `Status`), one row each, the searched knobs between `batch_size` and `peak_gib`, the host
  peak and budget after `budget_bytes` (studies written before host memory was counted have no
  such columns, and read as not counted);
- `pareto.csv`: the Pareto front, the rows `autofit search` prints and `point=N` counts;
- `best.yaml`: the best run as `autofit probe` overrides, with a header saying what it is.

Reading needs nothing but the standard library: report and export never open the Optuna study.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from autofit.config import suggest
from autofit.errors import AutofitError, ConfigError
from autofit.host import budget_words
from autofit.probe.spec import Outcome, ProbeResult
from autofit.search.pareto import run_size
from autofit.units import parsed_value, size
from autofit.units import value as show

RESULTS = Path("results")  # where studies live, under the working directory
SUMMARY, TRIALS, PARETO, BEST = "summary.json", "trials.csv", "pareto.csv", "best.yaml"
GIB = 1 << 30
# trials.csv's host memory columns, after budget_bytes (a study written before them has none).
HOST_COLUMNS = ("host_peak_gib", "host_peak_bytes", "host_pinned_bytes", "host_budget_bytes")


class Status(str, Enum):
    """What the search made of one combination at one resolution. A closed set."""

    PENDING = "pending"  # not searched yet
    EXACT = "exact"  # its largest fitting batch was found (`best_batch`)
    NONE_FIT = "none_fit"  # not even the space's smallest batch fits
    PRUNED = "pruned"  # a faster combination already fits all it could fit
    INVALID = "invalid"  # it cannot run (on this GPU, for this model, in the asked trainer)
    FAILED = "failed"  # a probe crashed or timed out, so its largest batch is not known


# -- writing -----------------------------------------------------------------------------------


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
) -> dict[str, Any]:
    """Write the four files of a search into `out`; return the summary. `combinations` are the
    search's (each with knobs, resolution, status, best_batch, probes and reason)."""
    out.mkdir(parents=True, exist_ok=True)
    budget = int(counts["budget_bytes"])
    summary = {
        **meta,
        **counts,
        "best": point(best) if best else None,
        "pareto": [point(r) for r in pareto],
        "combinations": [c.to_dict() for c in combinations],
    }
    if best is None:
        smallest = min((r.peak_bytes for r in results if r.peak_bytes), default=None)
        summary["nothing_fits"] = {"smallest_peak_bytes": smallest}
    (out / SUMMARY).write_text(json.dumps(summary, indent=2))
    _write_trials(out / TRIALS, results, combinations, budget, knob_names)
    _write_pareto(out / PARETO, pareto, knob_names)
    _write_best(out / BEST, best, meta)
    return summary


def _write_trials(
    path: Path,
    results: list[ProbeResult],
    combinations: list[Any],
    budget: int,
    knob_names: list[str],
) -> None:
    columns = ["outcome", "resolution", "batch_size", *knob_names, "peak_gib", "peak_bytes",
               "budget_bytes", *HOST_COLUMNS, "samples_per_s", "step_time_s", "phase", "backend",
               "reason"]  # fmt: skip
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        for result in results:
            writer.writerow(
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
                    "reason": (result.error or {}).get("message", ""),
                }
            )
        for combination in combinations:
            if combination.status in (Status.PRUNED, Status.INVALID):
                writer.writerow(
                    {
                        **combination.knobs,
                        "outcome": combination.status.value,
                        "resolution": combination.resolution,
                        "budget_bytes": budget,
                        "reason": combination.reason,
                    }
                )


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


def _write_pareto(path: Path, pareto: list[ProbeResult], knob_names: list[str]) -> None:
    columns = ["resolution", "batch_size", *knob_names, "run_size", "samples_per_s", "peak_gib",
               "peak_bytes", "host_peak_gib", "host_peak_bytes", "host_pinned_bytes"]  # fmt: skip
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        for result in pareto:
            writer.writerow(
                {
                    **result.config,
                    "run_size": run_size(result),
                    "samples_per_s": result.samples_per_s,
                    "peak_gib": round((result.peak_bytes or 0) / GIB, 3),
                    "peak_bytes": result.peak_bytes,
                    **_host_cells(result),
                }
            )


def _write_best(path: Path, best: ProbeResult | None, meta: dict[str, Any]) -> None:
    import yaml

    if best is None:
        path.write_text(f"# Nothing fits {meta['gpu']} in this space: no best configuration.\n")
        return
    how = "estimated" if best.throughput_estimated else "measured"
    host = (
        f"; host {size(best.host_peak_bytes)} of {budget_words(best.host_budget_bytes)}"
        if best.host_peak_bytes is not None
        else ""
    )
    header = (
        f"# The fastest configuration of {meta['model']} that fits {meta['gpu']}: peak "
        f"{size(best.peak_bytes)} of a {size(best.budget_bytes)} budget, "
        f"{best.samples_per_s:.3f} samples/s ({best.backend}, {how}){host}.\n"
        f"# Re-measure it with: autofit probe model={meta['model']} gpu={meta['gpu']} "
        + " ".join(f"{k}={show(v)}" for k, v in best.config.items())
        + "\n"
    )
    body = {"model": meta["model"], "gpu": meta["gpu"], **best.config}
    path.write_text(header + yaml.safe_dump(body, sort_keys=False))


# -- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """One row of trials.csv: a probed configuration (its `Outcome`), or a combination pruned or
    invalid without a probe (its `Status`; then `batch_size` is None)."""

    outcome: Outcome | Status
    resolution: int
    batch_size: int | None
    knobs: dict[str, Any]
    peak_bytes: int | None
    samples_per_s: float | None
    phase: str
    reason: str
    host_peak_bytes: int | None = None  # None: not counted (a study from before host memory)

    def key(self) -> tuple[Any, ...]:
        """What a configuration is matched by across studies: batch, resolution and knobs."""
        return (self.batch_size, self.resolution, knobs_key(self.knobs))


def knobs_key(knobs: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """Knob values as the command line writes them, so `False` from a CSV matches `false`."""
    return tuple(sorted((k, show(v)) for k, v in knobs.items()))


@dataclass
class Study:
    """A results folder, read."""

    path: Path
    summary: dict[str, Any]
    probes: list[Probe]  # trials.csv, in its order
    knob_names: list[str]

    @property
    def name(self) -> str:
        return str(self.summary.get("study") or self.path.name)

    @property
    def budget_bytes(self) -> int:
        return int(self.summary["budget_bytes"])

    @property
    def best(self) -> dict[str, Any] | None:
        return self.summary.get("best")

    @property
    def pareto(self) -> list[dict[str, Any]]:
        return list(self.summary.get("pareto") or [])

    @property
    def combinations(self) -> list[dict[str, Any]]:
        return list(self.summary.get("combinations") or [])

    def best_per_resolution(self) -> dict[int, dict[str, Any]]:
        """The fastest fitting run at each resolution (ties to less memory). The fastest run at a
        resolution is never dominated, so the Pareto front holds it."""
        best: dict[int, dict[str, Any]] = {}
        for run in self.pareto:
            resolution = int(run["config"]["resolution"])
            rank = (run["samples_per_s"] or 0.0, -(run["peak_bytes"] or 0))
            held = best.get(resolution)
            if held is None or rank > (held["samples_per_s"] or 0.0, -(held["peak_bytes"] or 0)):
                best[resolution] = run
        return dict(sorted(best.items()))

    def probes_of(self, combination: dict[str, Any]) -> list[Probe]:
        """The probes of one combination at its resolution, smallest batch first."""
        key, resolution = knobs_key(combination["knobs"]), int(combination["resolution"])
        return sorted(
            (
                p
                for p in self.probes
                if p.batch_size is not None
                and p.resolution == resolution
                and knobs_key(p.knobs) == key
            ),
            key=lambda p: p.batch_size or 0,
        )

    def smallest_peak(self) -> int | None:
        nothing = self.summary.get("nothing_fits") or {}
        if nothing.get("smallest_peak_bytes"):
            return int(nothing["smallest_peak_bytes"])
        return min((p.peak_bytes for p in self.probes if p.peak_bytes), default=None)


def _number(text: str, kind: type) -> Any:
    return kind(text) if text not in ("", None) else None


def _outcome(text: str) -> Outcome | Status:
    for vocabulary in (Outcome, Status):
        try:
            return vocabulary(text)
        except ValueError:
            pass
    valid = ", ".join([*(o.value for o in Outcome), Status.PRUNED.value, Status.INVALID.value])
    raise ValueError(f"outcome {text!r} is none of {valid}")


def _read_trials(path: Path) -> tuple[list[Probe], list[str]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        # The searched knobs sit between batch_size and peak_gib (write_results writes them so).
        fields = list(reader.fieldnames or [])
        knob_names = fields[fields.index("batch_size") + 1 : fields.index("peak_gib")]
        probes = [
            Probe(
                outcome=_outcome(row["outcome"]),
                resolution=int(row["resolution"]),
                batch_size=_number(row["batch_size"], int),
                knobs={k: parsed_value(row[k]) for k in knob_names},
                peak_bytes=_number(row["peak_bytes"], int),
                samples_per_s=_number(row["samples_per_s"], float),
                phase=row.get("phase") or "",
                reason=row.get("reason") or "",
                host_peak_bytes=_number(row.get("host_peak_bytes", ""), int),
            )
            for row in reader
        ]
    return probes, knob_names


def read_summary(path: Path) -> dict[str, Any]:
    """A study's summary.json, or a one-line error saying what is wrong with it."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AutofitError(f"cannot read the study summary {path}: {exc}") from None
    if not isinstance(summary, dict) or "budget_bytes" not in summary:
        raise AutofitError(
            f"cannot read the study in {path.parent}: {path.name} has no budget_bytes"
        )
    return summary


def load_study(folder: Path) -> Study:
    """Read a results folder of `autofit search`; a one-line error if it is not one."""
    summary_path, trials_path = folder / SUMMARY, folder / TRIALS
    if not summary_path.is_file():
        raise ConfigError(
            f"{folder} is not a study's results folder: it has no {SUMMARY} "
            f"(autofit search writes {SUMMARY}, {TRIALS}, {PARETO} and {BEST} there)"
        )
    summary = read_summary(summary_path)
    try:
        probes, knob_names = _read_trials(trials_path) if trials_path.is_file() else ([], [])
    except (OSError, ValueError, KeyError) as exc:
        raise AutofitError(f"cannot read the study in {folder}: {exc}") from None
    if not knob_names and summary.get("combinations"):
        knob_names = list(summary["combinations"][0]["knobs"])
    return Study(folder, summary, probes, knob_names)


# -- finding a study ---------------------------------------------------------------------------


def studies_under(results: Path) -> list[Path]:
    """Every study's results folder under `results/` (one with a summary.json), newest first."""
    found = [p.parent for p in results.glob(f"*/{SUMMARY}")]
    return sorted(found, key=lambda p: (p / SUMMARY).stat().st_mtime, reverse=True)


def study_folder(name: str, results: Path = RESULTS) -> Path:
    """Where `study=NAME`'s files are (and where a search writes them unless told `out=`)."""
    return results / name


def locate(
    study: str | None,
    from_dir: str | None,
    results: Path = RESULTS,
    setting: str = "study",
) -> Path:
    """The results folder a command reads: `from=DIR` as given (the folder, or its summary.json),
    `study=NAME` as results/NAME (`setting` names the setting in errors: compare=NAME), neither
    as the most recently written results/*/summary.json."""
    if study and from_dir:
        raise ConfigError(
            f"{setting}={study} and from={from_dir} both name a study: give one of them"
        )
    if from_dir:
        folder = Path(from_dir)
        folder = folder.parent if folder.name == SUMMARY else folder
        if not folder.is_dir():
            raise ConfigError(f"from={from_dir}: no such folder")
        if not (folder / SUMMARY).is_file():
            load_study(folder)  # says it is not a results folder
        return folder
    if study:
        for candidate in (study_folder(study, results), Path(study)):
            if (candidate / SUMMARY).is_file():
                return candidate
        names = [p.name for p in studies_under(results)]
        raise ConfigError(
            f"{setting}={study}: no such study{suggest(study, names)} (no "
            f"{study_folder(study, results)}/{SUMMARY}); studies: {', '.join(sorted(names)) or 'none yet'}"
        )
    found = studies_under(results)
    if not found:
        raise AutofitError(
            f"no study found under {results}/ (no */{SUMMARY}): run `autofit search` first, "
            "or name one with study=NAME or from=DIR"
        )
    return found[0]
