"""A study's results folder, `results/<study>/`: what a search writes there, what report and export
read back, and how any command finds it. The one place its layout is known.

- `summary.json`: study, model, gpu, backend, space, margin, budget, host budget
  (`host_budget_bytes`, null when not stated), probe counts, wall time, the best run and the
  Pareto front (each run with `config` holding every knob as applied, its GPU and host peaks),
  and every combination with its status (`Status`) and largest fitting batch or why it has none;
  `files`, the rows each table beside it holds (a reader tells a whole table from a cut one), and
  `rerun`, the `autofit search` line that writes the folder again;
- `trials.csv`: every probe (its outcome, an `Outcome`) and every pruned or invalid combination
  (its `Status`), one row each, the searched knobs between `batch_size` and `peak_gib`, the host
  peak and budget after `budget_bytes` (studies written before host memory was counted have no
  such columns, and read as not counted);
- `pareto.csv`: the Pareto front, the rows `autofit search` prints and `point=N` counts;
- `best.yaml`: the best run as `autofit probe` overrides, with a header saying what it is.

The four are written together (autofit/paths.py write_together): temporaries first, then renamed
into place with `summary.json`, the folder's commit marker, removed first and renamed last, so a
`summary.json` only ever stands beside the files of its own write. Reading checks the folder whole
(`check_folder`) and names a damaged file and the search that rewrites it in one line.

Reading needs nothing but the standard library: report and export never open the Optuna study.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shlex
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from autofit.config import suggest
from autofit.errors import AutofitError, ConfigError
from autofit.host import budget_words
from autofit.paths import search_spaces_dir, write_together
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
    """Write the four files of a search into `out`, together or not at all (summary.json, the
    folder's commit marker, last: autofit/paths.py write_together); return the summary.
    `combinations` are the search's (each with knobs, resolution, status, best_batch, probes and
    reason)."""
    budget = int(counts["budget_bytes"])
    trials, trial_rows = _trials_text(results, combinations, budget, knob_names)
    pareto_csv = _pareto_text(pareto, knob_names)
    summary = {
        **meta,
        **counts,
        "best": point(best) if best else None,
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
        BEST: _best_text(best, meta),
        SUMMARY: json.dumps(summary, indent=2),
    }
    try:
        write_together(out, files, marker=SUMMARY)
    except OSError as exc:
        raise AutofitError(f"cannot write the results to {out}: {exc.strerror or exc}") from None
    return summary


def rerun_command(meta: dict[str, Any], folder: Path) -> str:
    """The `autofit search` line that writes this study's folder again, from its meta: every
    value quoted for the shell. Settings the meta does not keep (target.*, timeout_s) are left
    at their defaults."""
    words = ["autofit", "search"]
    for key in ("model", "gpu", "space", "backend", "margin", "trainer"):
        if meta.get(key) is not None:
            words.append(f"{key}={show(meta[key])}")
    space = meta.get("space")
    if space and not (search_spaces_dir() / f"{space}.yaml").is_file():
        # The meta keeps a space file's stem: a file of that name here is the one searched.
        if Path(f"{space}.yaml").is_file():
            words[words.index(f"space={space}")] = f"space={space}.yaml"
    study = meta.get("study")
    if study:
        words.append(f"study={study}")
    storage = meta.get("storage")
    if storage and storage != f"sqlite:///{RESULTS / 'studies.db'}":
        words.append(f"storage={storage}")
    if not study or Path(folder) != study_folder(str(study)):
        words.append(f"out={folder}")
    return " ".join(shlex.quote(w) for w in words)


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
               "reason"]  # fmt: skip
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


def _best_text(best: ProbeResult | None, meta: dict[str, Any]) -> str:
    import yaml

    if best is None:
        return f"# Nothing fits {meta['gpu']} in this space: no best configuration.\n"
    how = "estimated" if best.throughput_estimated else "measured"
    host = (
        f"; host {size(best.host_peak_bytes)} of {budget_words(best.host_budget_bytes)}"
        if best.host_peak_bytes is not None
        else ""
    )
    probe = ["autofit", "probe", f"model={meta['model']}", f"gpu={meta['gpu']}"]
    probe += [f"{k}={show(v)}" for k, v in best.config.items()]
    header = (
        f"# The fastest configuration of {meta['model']} that fits {meta['gpu']}: peak "
        f"{size(best.peak_bytes)} of a {size(best.budget_bytes)} budget, "
        f"{best.samples_per_s:.3f} samples/s ({best.backend}, {how}){host}.\n"
        f"# Re-measure it with: {' '.join(shlex.quote(w) for w in probe)}\n"
    )
    body = {"model": meta["model"], "gpu": meta["gpu"], **best.config}
    return header + yaml.safe_dump(body, sort_keys=False)


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


class Damaged(AutofitError):
    """A results folder that is not whole: a file missing, cut short, or from another write."""


# What report and export need of a summary, and the type each must have.
NEEDED = {"budget_bytes": int, "model": str, "gpu": str, "pareto": list, "combinations": list}


def damaged(folder: Path, file: str, what: str, summary: dict[str, Any] | None = None) -> Damaged:
    """One line: which file of `folder` is damaged, how, and the search that rewrites it."""
    command = _rerun_of(summary, folder) if summary else None
    how = (
        f"rerun `{command}`"
        if command
        else f"rerun the `autofit search` that wrote it (study={folder.name}, or out={folder})"
    )
    return Damaged(f"{folder / file} is damaged ({what}): {how} to rewrite {folder}/")


def _rerun_of(summary: dict[str, Any], folder: Path) -> str | None:
    """The search that rewrites `folder`: the one its summary recorded when it was written there
    (a copied folder is rewritten where it now is, with out=), else one made from its meta."""
    stored = summary.get("rerun")
    if isinstance(stored, str) and stored.startswith("autofit search "):
        words = shlex.split(stored)
        study = summary.get("study")
        written_here = f"out={folder}" in words or (
            isinstance(study, str) and f"study={study}" in words and "out=" not in stored
            and Path(folder) == RESULTS / study
        )  # fmt: skip
        if written_here:
            return stored
    if isinstance(summary.get("model"), str):
        return rerun_command(summary, folder)
    return None


def _read_trials(
    folder: Path, summary: dict[str, Any], expected_rows: int | None
) -> tuple[list[Probe], list[str]]:
    """trials.csv, checked whole: its header, every row with every column, the last row ended,
    and as many rows as summary.json says were written."""
    path = folder / TRIALS
    text = path.read_text()
    if text and not text.endswith("\n"):
        raise damaged(folder, TRIALS, "its last row is cut short", summary)
    reader = csv.DictReader(io.StringIO(text, newline=""))
    # The searched knobs sit between batch_size and peak_gib (write_results writes them so).
    fields = list(reader.fieldnames or [])
    needed = ("outcome", "resolution", "batch_size", "peak_gib", "peak_bytes", "samples_per_s")
    missing = [c for c in needed if c not in fields]
    if missing:
        raise damaged(folder, TRIALS, f"its header has no {', '.join(missing)}", summary)
    knob_names = fields[fields.index("batch_size") + 1 : fields.index("peak_gib")]
    probes = []
    for row in reader:
        line = reader.line_num
        if None in row or None in row.values():
            raise damaged(folder, TRIALS, f"line {line} has not {len(fields)} columns", summary)
        try:
            probes.append(
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
            )
        except ValueError as exc:
            raise damaged(folder, TRIALS, f"line {line}: {exc}", summary) from None
    if expected_rows is not None and len(probes) != expected_rows:
        raise damaged(
            folder,
            TRIALS,
            f"{len(probes)} rows where {SUMMARY} says {expected_rows} were written",
            summary,
        )
    return probes, knob_names


def _check_table(folder: Path, name: str, expected_rows: int, summary: dict[str, Any]) -> None:
    """A CSV beside summary.json (pareto.csv): ended, every row whole, the rows it says."""
    text = (folder / name).read_text()
    if text and not text.endswith("\n"):
        raise damaged(folder, name, "its last row is cut short", summary)
    rows = list(csv.reader(io.StringIO(text, newline="")))
    width = len(rows[0]) if rows else 0
    if not rows or any(len(r) != width for r in rows) or len(rows) - 1 != expected_rows:
        raise damaged(
            folder, name, f"not the {expected_rows} whole rows {SUMMARY} says were written", summary
        )


def read_summary(path: Path) -> dict[str, Any]:
    """A study's summary.json, checked: it parses and holds what report and export read; else a
    one-line error naming the file and the search that rewrites the folder."""
    folder = path.parent
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise damaged(folder, path.name, "missing") from None
    except OSError as exc:
        raise damaged(folder, path.name, exc.strerror or str(exc)) from None
    try:
        summary = json.loads(text)
    except json.JSONDecodeError as exc:
        raise damaged(
            folder, path.name, f"not whole JSON: {exc.msg} at line {exc.lineno}"
        ) from None
    if not isinstance(summary, dict):
        raise damaged(folder, path.name, "not a JSON object")
    wrong = [k for k, kind in NEEDED.items() if not isinstance(summary.get(k), kind)]
    if summary.get("best") is not None and not isinstance(summary["best"], dict):
        wrong.append("best")
    if wrong:
        raise damaged(folder, path.name, f"no valid {', '.join(wrong)}", summary)
    return summary


def check_folder(folder: Path) -> tuple[dict[str, Any], list[Probe], list[str]]:
    """A results folder read and checked whole: its summary, trials and knob names, or a
    one-line error (`Damaged`) naming the damaged file and the search that rewrites it.

    A summary written with its files' record (`files`) must have each file beside it, with the
    rows it lists; one from before that record is read as it is."""
    summary_path = folder / SUMMARY
    if not summary_path.is_file():
        leftovers = [p.name for p in (folder.iterdir() if folder.is_dir() else [])]
        if any(name in leftovers for name in (TRIALS, PARETO, BEST)):
            raise damaged(folder, SUMMARY, "missing: the search that wrote the others stopped")
        raise ConfigError(
            f"{folder} is not a study's results folder: it has no {SUMMARY} "
            f"(autofit search writes {SUMMARY}, {TRIALS}, {PARETO} and {BEST} there)"
        )
    summary = read_summary(summary_path)
    record = summary.get("files")
    if record is not None and not isinstance(record, dict):
        raise damaged(folder, SUMMARY, "its files record is not a JSON object", summary)
    record = record or {}
    for name in record:
        if not (folder / name).is_file():
            raise damaged(folder, name, "missing", summary)
    rows = (record.get(TRIALS) or {}).get("rows")
    try:
        if (folder / TRIALS).is_file():
            probes, knob_names = _read_trials(folder, summary, rows)
        else:
            probes, knob_names = [], []
        if isinstance((record.get(PARETO) or {}).get("rows"), int):
            _check_table(folder, PARETO, record[PARETO]["rows"], summary)
    except (OSError, UnicodeDecodeError) as exc:
        raise damaged(folder, TRIALS, str(exc), summary) from None
    if not knob_names and summary.get("combinations"):
        first = summary["combinations"][0]
        if not isinstance(first, dict) or not isinstance(first.get("knobs"), dict):
            raise damaged(folder, SUMMARY, "its combinations have no knobs", summary)
        knob_names = list(first["knobs"])
    return summary, probes, knob_names


def load_study(folder: Path) -> Study:
    """Read a results folder of `autofit search`, checked whole (check_folder)."""
    summary, probes, knob_names = check_folder(folder)
    return Study(folder, summary, probes, knob_names)


# -- finding a study ---------------------------------------------------------------------------


def studies_under(results: Path) -> list[Path]:
    """Every study's results folder under `results/` (one with a summary.json), newest first."""
    found = [p.parent for p in results.glob(f"*/{SUMMARY}")]
    return sorted(found, key=lambda p: (p / SUMMARY).stat().st_mtime, reverse=True)


def check_study_name(name: str, setting: str = "study") -> str:
    """A study is named, not placed: `study=NAME` is a folder under results/ and an Optuna study
    name, so it holds no path separator, is not `..` (or any name starting with a dot, hidden
    and reserved), and is not empty. `out=` is where a user chooses a folder."""
    bad = (
        "it is empty"
        if not name.strip()
        else "it holds a path separator"
        if "/" in name or "\\" in name or (os.altsep and os.altsep in name)
        else "it starts with '.'"
        if name.startswith(".")
        else "it holds a line break or control character"
        if any(ord(c) < 32 for c in name)
        else None
    )
    if bad:
        raise ConfigError(
            f"{setting}={name!r} is not a study name: {bad}; a name is one folder under "
            f"{RESULTS}/ (any characters but '/' and '\\', not starting with '.'); choose a "
            "folder with out=DIR"
        )
    return name


def study_folder(name: str, results: Path = RESULTS) -> Path:
    """Where `study=NAME`'s files are (and where a search writes them unless told `out=`)."""
    return results / check_study_name(name)


def _is_path(text: str) -> bool:
    return "/" in text or "\\" in text or text.startswith(".")


def locate(
    study: str | None,
    from_dir: str | None,
    results: Path = RESULTS,
    setting: str = "study",
) -> Path:
    """The results folder a command reads: `from=DIR` as given (the folder, or its summary.json),
    `study=NAME` as results/NAME (`setting` names the setting in errors: compare=NAME), neither
    as the most recently written results/*/summary.json."""
    if study is not None and from_dir:
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
    if study is not None:  # study='' too: not a name, and said so
        if setting == "compare" and _is_path(study):
            # compare= takes a results folder as well as a name (it is only read).
            candidate = Path(study)
            if not candidate.is_dir():
                raise ConfigError(f"{setting}={study}: no such folder")
            return candidate.parent if candidate.name == SUMMARY else candidate
        check_study_name(study, setting)
        candidate = study_folder(study, results)
        if any((candidate / name).is_file() for name in (TRIALS, PARETO, BEST)):
            return candidate  # a study's folder: reading it says what it lacks
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
