"""Which layout of a results folder a search wrote, and the steps that bring an older one to
today's, one version at a time (optuna's SCHEMA_VERSION with its migrations is the shape).

summary.json carries `schema_version`. A folder written before it did is the version its fields
show: the newest whose marks, and every older version's, it holds (`written_version`). Reading
migrates it in memory, step by step, to today's shape (`migrated`), so that
autofit/results/read.py reads one shape; a results folder is never rewritten by reading it. A
step adds what its version added only where the folder lacks it (a hand edit may hold some).

The versions, each with the commit that first wrote it and what it changed:

1. 3f405a6 (autofit/search/outputs.py). summary.json: study, model, gpu, backend, space, margin,
   storage, budget_bytes, n_probes, new_probes, reused_probes, wall_s, best, pareto,
   combinations (knobs, resolution, status, best_batch, probes, reason), and nothing_fits where
   nothing fits; a run: config, peak_bytes, samples_per_s, step_time_s, run_size, breakdown.
   trials.csv: outcome, resolution, batch_size, the knobs, peak_gib, peak_bytes, budget_bytes,
   samples_per_s, step_time_s, phase, backend, reason. pareto.csv: resolution, batch_size, the
   knobs, run_size, samples_per_s, peak_gib, peak_bytes. From 1301a0e, `trainer` where the
   search had one.
2. 060a5e1 (autofit/results.py): host memory. `host_budget_bytes` (null: not stated; absent,
   in an older folder migrated: not counted), a run's `host_peak_bytes` and
   `host_pinned_bytes`; trials.csv's HOST_COLUMNS after budget_bytes; pareto.csv's
   host_peak_gib, host_peak_bytes and host_pinned_bytes; the outcome oom_host.
3. 0db0539: the four files written together. `files` (the rows each table beside it holds) and
   `rerun` (the search that writes the folder again).
4. 242cd25 (autofit/results/write.py): the best rule. `best_rule` (speed_tolerance,
   memory_gain) and `fastest`: the fastest run where the rule chose a lighter one as `best`
   (null where the best is the fastest, as it always was before). best.yaml says which.
5. 6d778b0: trials.csv's `source` (traced, replayed or measured) after backend. From 05d6249,
   `overrides`, the search's settings as given, where the search was given them.
6. 4a8407c: `margin_basis`, what backs the margin (margin=auto chooses it). From 3214588,
   `trainer_stack` beside `trainer`; `schema_version` since it was kept, the layout unchanged.

A field a search writes only sometimes (nothing_fits, trainer, trainer_stack, trainer_values,
overrides, and `host_budget_basis`, where the host budget came from, beside a stated budget) is
absent from some folders of today too: its absence marks no version, and no step adds it.
pareto.csv is read for its rows' number only, so no step touches it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autofit.errors import AutofitError
from autofit.results.layout import HOST_COLUMNS

SCHEMA_VERSION = 6  # the layout write.py writes; add a step below with every change to it

Row = dict[str, str]


@dataclass(frozen=True)
class Written:
    """A results folder as one version of autofit wrote it: summary.json's object, and
    trials.csv's header and rows where they were read (`columns` None: the summary alone, as
    export reads it). A step keeps the rows' number and order."""

    summary: dict[str, Any]
    columns: list[str] | None = None
    rows: Sequence[Row] = ()


class NewerSchema(AutofitError):
    """A summary.json a newer autofit wrote, in a layout this one cannot read."""


# -- the steps, oldest first ---------------------------------------------------------------------


def migrate_1_to_2(old: Written) -> Written:
    """Host memory (060a5e1): in a folder from before autofit counted it, no run has a host peak
    and no probe a host cell (not counted). Its summary keeps no `host_budget_bytes`: null says
    a budget was not stated for a search that counted host memory; absent, that none was counted
    (the report's headline states no host budget for such a study)."""
    summary = _each_run({**old.summary}, {"host_peak_bytes": None, "host_pinned_bytes": None})
    return _with_columns(replace(old, summary=summary), HOST_COLUMNS, "budget_bytes")


def migrate_2_to_3(old: Written) -> Written:
    """The files written together (0db0539): no record of the rows each table holds (each is
    read as it is), no `rerun` line (one is made from the meta where a message needs it)."""
    return replace(old, summary={"files": None, "rerun": None, **old.summary})


def migrate_3_to_4(old: Written) -> Written:
    """The best rule (242cd25): the best was the fastest fitting run, chosen by no rule."""
    return replace(old, summary={"best_rule": None, "fastest": None, **old.summary})


def migrate_4_to_5(old: Written) -> Written:
    """trials.csv's source (6d778b0): where a probe's figures come from is not recorded."""
    return _with_columns(old, ("source",), "backend")


def migrate_5_to_6(old: Written) -> Written:
    """The margin's basis (4a8407c): the margin was the number given; what backs it is not
    recorded."""
    return replace(old, summary={"margin_basis": None, **old.summary})


@dataclass(frozen=True)
class Step:
    """The step to version `to` from the one before, and the marks that version added which tell
    a folder written without `schema_version` apart: summary.json's fields, trials.csv's
    columns (looked for only where trials.csv is read)."""

    to: int
    migrate: Callable[[Written], Written]
    fields: tuple[str, ...] = ()
    columns: tuple[str, ...] = ()


STEPS: tuple[Step, ...] = (
    Step(2, migrate_1_to_2, fields=("host_budget_bytes",), columns=("host_peak_bytes",)),
    Step(3, migrate_2_to_3, fields=("files", "rerun")),
    Step(4, migrate_3_to_4, fields=("best_rule", "fastest")),
    Step(5, migrate_4_to_5, columns=("source",)),
    Step(6, migrate_5_to_6, fields=("margin_basis",)),
)


# -- reading -------------------------------------------------------------------------------------


def stated_version(path: Path, summary: dict[str, Any]) -> int | None:
    """The `schema_version` the summary at `path` states (None: written before autofit kept it).
    A version newer than this autofit reads is refused in one line; one that is not a version
    raises ValueError, for the caller to call the file damaged."""
    if "schema_version" not in summary:
        return None
    version = summary["schema_version"]
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"its schema_version {version!r} is not a version")
    if version > SCHEMA_VERSION:
        raise NewerSchema(
            f"{path} was written by a newer autofit (schema_version {version}; this autofit reads "
            f"up to {SCHEMA_VERSION}): upgrade autofit to read it"
        )
    return version


def written_version(path: Path, summary: dict[str, Any], columns: list[str] | None = None) -> int:
    """The version that wrote the summary at `path` (and the trials.csv header `columns`, where
    read): the one it states, else the newest version whose marks, and every older version's,
    it holds."""
    stated = stated_version(path, summary)
    if stated is not None:
        return stated
    version = 1
    for step in STEPS:
        if any(f not in summary for f in step.fields):
            break
        if columns is not None and any(c not in columns for c in step.columns):
            break
        version = step.to
    return version


def migrated(written: Written, version: int) -> Written:
    """`written`, of `version`, in today's shape: each step after `version` in turn."""
    for step in STEPS[version - 1 :]:
        written = step.migrate(written)
    return replace(written, summary={**written.summary, "schema_version": SCHEMA_VERSION})


def _each_run(summary: dict[str, Any], added: dict[str, Any]) -> dict[str, Any]:
    """`summary` with `added` in each of its runs that lacks it (the best, the fastest and the
    Pareto front's; a run that is not an object is left for the reader to call damaged)."""

    def filled(run: Any) -> Any:
        return {**added, **run} if isinstance(run, dict) else run

    for key in ("best", "fastest"):
        if key in summary:
            summary[key] = filled(summary[key])
    summary["pareto"] = [filled(run) for run in summary["pareto"]]
    return summary


def _with_columns(old: Written, added: Sequence[str], after: str) -> Written:
    """trials.csv with the columns `added` it lacks placed after column `after`, empty in every
    row (an empty cell: not recorded)."""
    if old.columns is None:
        return old
    new = [c for c in added if c not in old.columns]
    at = old.columns.index(after) + 1 if after in old.columns else len(old.columns)
    columns = [*old.columns[:at], *new, *old.columns[at:]]
    return replace(old, columns=columns, rows=[{**dict.fromkeys(new, ""), **r} for r in old.rows])
