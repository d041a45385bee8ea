"""The names in a results folder, what a combination's status can be, and what a study may be
called (a folder under results/, never a path)."""

from __future__ import annotations

import os
from pathlib import Path

from autofit.errors import ConfigError, shown

RESULTS = Path("results")  # where studies live, under the working directory
SUMMARY, TRIALS, PARETO, BEST = "summary.json", "trials.csv", "pareto.csv", "best.yaml"
GIB = 1 << 30
# trials.csv's host memory columns, after budget_bytes (a study written before them has none).
HOST_COLUMNS = ("host_peak_gib", "host_peak_bytes", "host_pinned_bytes", "host_budget_bytes")


# -- naming a study ---------------------------------------------------------------------------


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
            f"{setting}={shown(name)} is not a study name: {bad}; a name is one folder under "
            f"{RESULTS}/ (any characters but '/' and '\\', not starting with '.'); choose a "
            "folder with out=DIR"
        )
    return name


def study_folder(name: str, results: Path = RESULTS) -> Path:
    """Where `study=NAME`'s files are (and where a search writes them unless told `out=`)."""
    return results / check_study_name(name)
