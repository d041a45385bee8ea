"""What report and export read back from a results folder, checked whole: a damaged file is
named in one line with the search that rewrites it, and every stored configuration is checked
against the knob registry (a value no knob takes is one line, never a different export)."""

from __future__ import annotations

import csv
import io
import json
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autofit.command_line import override
from autofit.errors import AutofitError, ConfigError, shown, suggest
from autofit.knobs import registry
from autofit.records.probe import Outcome
from autofit.records.status import Status
from autofit.results.layout import BEST, PARETO, RESULTS, SUMMARY, TRIALS
from autofit.results.schema import Written, migrated, stated_version, written_version
from autofit.results.write import rerun_command
from autofit.units import parsed_value
from autofit.units import value as show


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
    backend: str = ""  # simulate, cuda or cpu; "" for a row without a probe
    source: str = ""  # a simulated probe's "traced" or "replayed", where trials.csv says so

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
        return self.summary["best"]

    @property
    def pareto(self) -> list[dict[str, Any]]:
        return list(self.summary["pareto"])

    @property
    def combinations(self) -> list[dict[str, Any]]:
        return list(self.summary["combinations"])

    def chosen_per_resolution(self) -> dict[int, dict[str, Any]]:
        """The run the report shows at each resolution: the search's best at its own (which may
        trade a little speed for headroom: the best rule), the fastest that fits at the others."""
        chosen = self.fastest_per_resolution()
        if self.best is not None:
            chosen[int(self.best["config"]["resolution"])] = self.best
        return chosen

    def fastest_per_resolution(self) -> dict[int, dict[str, Any]]:
        """The fastest fitting run at each resolution (ties to less memory); of a video model, at
        the longest clip that fits there, as the search's answer is. The fastest run at a
        resolution (and clip) is never dominated, so the Pareto front holds it."""

        def rank(run: dict[str, Any]) -> tuple[int, float, int]:
            clip = int(run["config"].get("frames") or 1)
            return clip, run["samples_per_s"] or 0.0, -(run["peak_bytes"] or 0)

        best: dict[int, dict[str, Any]] = {}
        for run in self.pareto:
            resolution = int(run["config"]["resolution"])
            held = best.get(resolution)
            if held is None or rank(run) > rank(held):
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
    raise ValueError(f"outcome {shown(text)} is none of {valid}")


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
        else (
            "rerun the `autofit search` that wrote it "
            f"({override('study', folder.name)}, or {override('out', str(folder))})"
        )
    )
    return Damaged(f"{folder / file} is damaged ({what}): {how} to rewrite {folder}/")


def _rerun_of(summary: dict[str, Any], folder: Path) -> str | None:
    """The search that rewrites `folder`: the one its summary recorded when it was written there
    (a copied folder is rewritten where it now is, with out=), else one made from its meta."""
    stored = summary.get("rerun")
    if isinstance(stored, str) and stored.startswith("autofit search "):
        words = shlex.split(stored)
        study = summary.get("study")
        written_here = override("out", str(folder)) in words or (
            isinstance(study, str) and override("study", study) in words
            and not any(w.startswith("out=") for w in words) and Path(folder) == RESULTS / study
        )  # fmt: skip
        if written_here:
            return stored
    if isinstance(summary.get("model"), str):
        return rerun_command(summary, folder)
    return None


def _written_trials(
    folder: Path, summary: dict[str, Any]
) -> tuple[list[str], list[dict[str, str]], list[int]]:
    """trials.csv as written, checked whole: its header, and its rows (each with the line it ends
    on), every one with every column and the last one ended."""
    path = folder / TRIALS
    text = path.read_text()
    if text and not text.endswith("\n"):
        raise damaged(folder, TRIALS, "its last row is cut short", summary)
    reader = csv.DictReader(io.StringIO(text, newline=""))
    fields = list(reader.fieldnames or [])
    rows, lines = [], []
    for row in reader:
        line = reader.line_num
        if None in row or None in row.values():
            raise damaged(folder, TRIALS, f"line {line} has not {len(fields)} columns", summary)
        rows.append(row)
        lines.append(line)
    return fields, rows, lines


# What reading needs of trials.csv, in today's shape (autofit/results/schema.py adds the columns
# of later versions to an older file).
NEEDED_COLUMNS = ("outcome", "resolution", "batch_size", "peak_gib", "peak_bytes", "samples_per_s",
                  "host_peak_bytes", "source")  # fmt: skip


def _knob_names(columns: list[str]) -> list[str]:
    """The searched knobs: between batch_size and peak_gib (write_results writes them so)."""
    return columns[columns.index("batch_size") + 1 : columns.index("peak_gib")]


def _probes(
    folder: Path, summary: dict[str, Any], trials: Written, lines: list[int], expected_rows: Any
) -> tuple[list[Probe], list[str]]:
    """trials.csv's rows, in today's shape, as probes: every value parsed and checked, and as
    many rows as summary.json says were written (`expected_rows`; None: not recorded)."""
    path = folder / TRIALS
    columns = list(trials.columns or [])
    missing = [c for c in NEEDED_COLUMNS if c not in columns]
    if missing:
        raise damaged(folder, TRIALS, f"its header has no {', '.join(missing)}", summary)
    knob_names = _knob_names(columns)
    for name in knob_names:
        if name not in registry():
            raise _unknown_knob(path, "its header", name)
    probes = []
    for line, row in zip(lines, trials.rows, strict=True):
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
                    host_peak_bytes=_number(row["host_peak_bytes"], int),
                    backend=row.get("backend") or "",
                    source=row["source"],
                )
            )
        except ValueError as exc:
            raise damaged(folder, TRIALS, f"line {line}: {exc}", summary) from None
        sized = {"resolution": probes[-1].resolution, "batch_size": probes[-1].batch_size}
        _check_knobs(path, f"line {line}", {**probes[-1].knobs, **sized})
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
    """A study's summary.json, checked, in today's shape: it parses and holds what report and
    export read; else a one-line error naming the file and the search that rewrites the folder.
    One an older autofit wrote is migrated as it is read (autofit/results/schema.py); one a newer
    autofit wrote, in a layout this one does not know, is refused in one line."""
    return _migrated(path, Written(_written_summary(path))).summary


def _written_summary(path: Path) -> dict[str, Any]:
    """summary.json as written: a JSON object with what every version wrote that report and
    export read, of a version this autofit reads."""
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
    try:
        stated_version(path, summary)  # a newer layout is refused before it is judged damaged
    except ValueError as exc:
        raise damaged(folder, path.name, str(exc), summary) from None
    wrong = [k for k, kind in NEEDED.items() if not isinstance(summary.get(k), kind)]
    if summary.get("best") is not None and not isinstance(summary["best"], dict):
        wrong.append("best")
    if wrong:
        raise damaged(folder, path.name, f"no valid {', '.join(wrong)}", summary)
    return summary


def _migrated(path: Path, written: Written) -> Written:
    """A folder as written (its summary at `path`, read by _written_summary), in today's shape,
    every stored configuration checked."""
    today = migrated(written, written_version(path, written.summary, written.columns))
    for where, config in _stored_configs(today.summary):
        if not isinstance(config, dict):
            raise damaged(path.parent, path.name, f"{where} has no configuration", today.summary)
        _check_knobs(path, where, config)
    return today


def _stored_configs(summary: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Every configuration a summary stores (None where a run has none), with the words that
    say which it is."""
    runs = [(f"Pareto point {n}", run) for n, run in enumerate(summary["pareto"], start=1)]
    for where in ("best", "fastest"):
        if summary[where] is not None:  # none where nothing fits, or the best is the fastest
            runs.append((f"the {where} run", summary[where]))
    for where, run in runs:
        yield where, run.get("config") if isinstance(run, dict) else None
    for n, combination in enumerate(summary["combinations"], start=1):
        knobs = combination.get("knobs") if isinstance(combination, dict) else None
        yield f"combination {n}", knobs


def _check_knobs(path: Path, where: str, config: dict[str, Any]) -> None:
    """A stored configuration, checked with each knob's own parse: a knob this autofit does not
    know, or a value its knob does not take (a hand edit, or a folder a newer autofit wrote),
    is one line naming the file, the knob and the valid values, so that no report or export
    quietly stands for another run. A knob the folder predates is absent: at its default, as it
    ran (autofit/knobs/base.py)."""
    for name, value in config.items():
        knob = registry().get(name)
        if knob is None:
            raise _unknown_knob(path, where, name)
        if value is None and name == "batch_size":
            continue  # a pruned or invalid combination's row in trials.csv: no batch was probed
        try:
            knob.parse(value)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {where}: {exc}{EDITED}") from None


# What a stored value no knob takes says about its folder.
EDITED = " (the folder was edited by hand, or written by a newer autofit)"


def _unknown_knob(path: Path, where: str, name: str) -> ConfigError:
    known = list(registry())
    return ConfigError(
        f"{path}: {where}: unknown knob '{name}'{suggest(name, known)}; valid knobs: "
        f"{', '.join(known)}{EDITED}"
    )


def check_folder(folder: Path) -> tuple[dict[str, Any], list[Probe], list[str]]:
    """A results folder read and checked whole, in today's shape: its summary, trials and knob
    names, or a one-line error (`Damaged`) naming the damaged file and the search that rewrites
    it.

    A summary with its files' record (`files`) must have each file beside it, with the rows it
    lists; one from before that record (None once migrated) is read as it is."""
    summary_path = folder / SUMMARY
    if not summary_path.is_file():
        leftovers = [p.name for p in (folder.iterdir() if folder.is_dir() else [])]
        if any(name in leftovers for name in (TRIALS, PARETO, BEST)):
            raise damaged(folder, SUMMARY, "missing: the search that wrote the others stopped")
        raise ConfigError(
            f"{folder} is not a study's results folder: it has no {SUMMARY} "
            f"(autofit search writes {SUMMARY}, {TRIALS}, {PARETO} and {BEST} there)"
        )
    written = _written_summary(summary_path)
    columns, rows, lines = None, [], []
    if (folder / TRIALS).is_file():
        try:
            columns, rows, lines = _written_trials(folder, written)
        except (OSError, UnicodeDecodeError) as exc:
            raise damaged(folder, TRIALS, str(exc), written) from None
    today = _migrated(summary_path, Written(written, columns, rows))
    summary, record = today.summary, today.summary["files"]
    if record is not None and not isinstance(record, dict):
        raise damaged(folder, SUMMARY, "its files record is not a JSON object", summary)
    record = record or {}
    for name in record:
        if not (folder / name).is_file():
            raise damaged(folder, name, "missing", summary)
    probes: list[Probe] = []
    knob_names: list[str] = []
    if columns is not None:
        probes, knob_names = _probes(
            folder, summary, today, lines, (record.get(TRIALS) or {}).get("rows")
        )
    try:
        if isinstance((record.get(PARETO) or {}).get("rows"), int):
            _check_table(folder, PARETO, record[PARETO]["rows"], summary)
    except (OSError, UnicodeDecodeError) as exc:
        raise damaged(folder, TRIALS, str(exc), summary) from None
    if not knob_names and summary["combinations"]:
        first = summary["combinations"][0]
        if not isinstance(first, dict) or not isinstance(first.get("knobs"), dict):
            raise damaged(folder, SUMMARY, "its combinations have no knobs", summary)
        knob_names = list(first["knobs"])
    return summary, probes, knob_names


def load_study(folder: Path) -> Study:
    """Read a results folder of `autofit search`, checked whole (check_folder)."""
    summary, probes, knob_names = check_folder(folder)
    return Study(folder, summary, probes, knob_names)
