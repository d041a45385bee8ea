"""The table a sweep of `autofit search` ends with, the answer people sweep for: a row per job
(its model, GPU and every other swept setting whose value differs between jobs) with its best
run, samples/s, peak, headroom (the budget less the peak), whether it was simulated and its
results folder; a job where nothing fits, or that failed, has a row saying so. It is printed, and
written as CSV with the same columns (`sweep.csv` in the sweep's folder), whose cells are the raw
values (bytes, a fraction, true/false) the printed ones are rendered from.

Each row is read from the job's results folder with `load_study`, as `autofit report` reads it. A
job that did not exit 0 shows results only if it wrote them during this sweep (a search where
nothing fits writes its folder, then exits 1): an older folder of the same study is not its answer.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from autofit.commands.search import next_search, search_settings, study_and_folder
from autofit.errors import AutofitError
from autofit.probe.build import gpu_from_config, preset_from_config
from autofit.report.tables import Table
from autofit.results import SUMMARY, Study, load_study
from autofit.search.space import load_space
from autofit.units import size
from autofit.units import value as show

SWEEP_TABLE = "sweep.csv"  # in the sweep's folder (hydra.sweep.dir)
ALWAYS = ("model", "gpu")  # the settings every row names, swept or not


class Answer(str, Enum):
    """What a job's row says. A closed set."""

    FITS = "fits"  # its best run is on the row
    NOTHING_FITS = "nothing_fits"  # it searched, and not even the smallest run fits
    FAILED = "failed"  # no answer: the row says how it failed


@dataclass(frozen=True)
class Column:
    name: str  # the CSV's header
    title: str  # the printed table's
    text: Callable[[Any], str] = str  # a printed cell, from the CSV's value (a missing one is "-")


COLUMNS = (  # after a column per setting (ALWAYS, then the swept ones that differ)
    Column("answer", "answer"),
    Column("best", "best run"),  # batch, resolution, the knobs its search varied; or why none
    Column("samples_per_s", "samples/s", lambda v: f"{v:.3f}"),
    Column("peak_bytes", "peak", size),
    Column("headroom_bytes", "headroom", size),  # the budget less the peak
    Column("headroom_share", "of budget", lambda v: f"{v:.1%}"),
    Column("simulated", "simulated", show),
    Column("results", "results"),
)


def settings_columns(overrides: Sequence[Sequence[str]]) -> list[Column]:
    """model and gpu, then each other setting whose value differs between the jobs' overrides
    (as the sweep's summary line shows them: a storage URL's password masked)."""
    values = [_settings(o) for o in overrides]
    keys = list(dict.fromkeys([*ALWAYS, *(k for v in values for k in v)]))
    differ = [k for k in keys if k in ALWAYS or len({v.get(k) for v in values}) > 1]
    return [Column(k, k) for k in differ]


def _settings(overrides: Sequence[str]) -> dict[str, str]:
    pairs = (o.split("=", 1) for o in overrides if "=" in o)
    return {k.lstrip("+~"): v for k, v in pairs}


def job_row(
    overrides: Sequence[str], cfg: Any, failure: str | None, since: float
) -> dict[str, Any]:
    """One job's row: its settings, and its answer read from its results folder. `cfg` is the
    job's composed config (None when the job left none), `failure` how it failed (None: it exited
    0), `since` when the sweep started (a results folder written before is not this job's)."""
    row: dict[str, Any] = {**_settings(overrides), "answer": Answer.FAILED.value, "best": failure}
    try:
        folders = results_folders(cfg) if cfg is not None else []
        fresh = bool(folders) and (
            failure is None or (folders[0] / SUMMARY).stat().st_mtime >= since
        )
        if not fresh:
            return row
        folder, study = folders[0], load_study(folders[0])
        # Where nothing fit, the search went on to its space's if_nothing_fits: that answers.
        for following in folders[1:]:
            if study.best is not None or not (following / SUMMARY).exists():
                break
            if (following / SUMMARY).stat().st_mtime < (folder / SUMMARY).stat().st_mtime:
                break  # an older search's folder, not this job's
            folder, study = following, load_study(following)
    except (AutofitError, OSError) as exc:
        if failure is None:
            row["best"] = f"no results: {exc}"
        return row
    row["results"] = str(folder)
    row["simulated"] = study.summary.get("backend") == "simulate"
    best, budget = study.best, study.budget_bytes
    if best is None:
        smallest = study.smallest_peak()
        row["answer"] = Answer.NOTHING_FITS.value
        row["best"] = f"nothing fits: smallest peak {size(smallest)}, budget {size(budget)}"
        return row
    if failure is not None:  # results of its own, and still a failure: say both
        return {**row, "best": f"{failure}, after writing {folder}"}
    peak = int(best["peak_bytes"])
    return {
        **row,
        "answer": Answer.FITS.value,
        "best": best_words(study),
        "samples_per_s": best["samples_per_s"],
        "peak_bytes": peak,
        "headroom_bytes": budget - peak,
        "headroom_share": (budget - peak) / budget,
    }


def best_words(study: Study) -> str:
    """The best run in short: its batch and resolution, and the knobs whose value differs between
    the study's combinations (one the whole space holds fixed says nothing about this run)."""
    config = (study.best or {})["config"]
    varied = [
        k
        for k in study.knob_names
        if len({show(c.get("knobs", {}).get(k)) for c in study.combinations}) > 1
    ]
    knobs = [f"{k}={show(config[k])}" for k in varied if k in config]
    return " ".join([f"b={config['batch_size']}", f"res={config['resolution']}", *knobs])


def results_folders(cfg: Any) -> list[Path]:
    """Where the search a job's config describes writes its files (autofit/commands/search.py
    study_and_folder, which the search itself uses), then where each search it goes on to
    where nothing fits writes its own (the spaces' if_nothing_fits, next_search)."""
    settings = search_settings(cfg)
    preset, gpu = preset_from_config(settings.model), gpu_from_config(settings.gpu)
    folders: list[Path] = []
    names: set[str] = set()
    while True:
        space = load_space(settings.space, preset)
        folders.append(study_and_folder(settings, preset, gpu, space)[1])
        names.add(space.name)
        following = space.if_nothing_fits
        if following is None or Path(following).stem in names:
            return folders
        settings = next_search(settings, following)


def table_text(columns: Sequence[Column], rows: Sequence[dict[str, Any]]) -> str:
    cells = [[_printed(c, row.get(c.name)) for c in columns] for row in rows]
    shared = _shared_folders(rows)
    return Table(
        f"the sweep's {len(rows)} jobs, each one's best run", [c.title for c in columns], cells,
        note="\n".join(
            f"{folder}: written by {n} jobs, so it holds the last one's results; a swept setting "
            "the study's name leaves out (margin, backend, ...) needs study= or out= per job"
            for folder, n in shared.items()
        ),
    ).text()  # fmt: skip


def _printed(column: Column, value: Any) -> str:
    return "-" if value is None else column.text(value)


def _shared_folders(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        if row.get("results"):
            counts[row["results"]] = counts.get(row["results"], 0) + 1
    return {folder: n for folder, n in counts.items() if n > 1}


def csv_text(columns: Sequence[Column], rows: Sequence[dict[str, Any]]) -> str:
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow([c.name for c in columns])
    for row in rows:
        writer.writerow([_raw(row.get(c.name)) for c in columns])
    return buffer.getvalue()


def _raw(value: Any) -> str:
    return "" if value is None else show(value)
