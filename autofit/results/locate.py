"""How a command finds the study it reads: from=DIR, study=NAME, or the newest under results/."""

from __future__ import annotations

import json
import time
from pathlib import Path

from autofit.config import suggest
from autofit.errors import AutofitError, ConfigError
from autofit.results.layout import (
    BEST,
    PARETO,
    RESULTS,
    SUMMARY,
    TRIALS,
    check_study_name,
    study_folder,
)
from autofit.results.read import load_study


def studies_under(results: Path) -> list[Path]:
    """Every study's results folder under `results/` (one with a summary.json), newest first."""
    found = [p.parent for p in results.glob(f"*/{SUMMARY}")]
    return sorted(found, key=lambda p: (p / SUMMARY).stat().st_mtime, reverse=True)


def _is_path(text: str) -> bool:
    return "/" in text or "\\" in text or text.startswith(".")


def locate(
    study: str | None,
    from_dir: str | None,
    results: Path = RESULTS,
    setting: str = "study",
    named: str = "",
) -> Path:
    """The results folder a command reads: `from=DIR` as given (the folder, or its summary.json),
    `study=NAME` as results/NAME (`setting` names the setting in errors: compare=NAME), neither
    as the most recently written results/*/summary.json. `named`: what the command does with
    the study, for a command that must not guess (an export): with more than one study under
    results/ and none named, it asks for study= and lists the recent ones."""
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
    if named and len(found) > 1:
        # A shared folder's newest study may be another user's search of a second ago.
        recent = "; ".join(_described(p) for p in found[:RECENT])
        raise ConfigError(
            f"{len(found)} studies under {results}/: name the one to {named} with study=NAME "
            f"(the search printed it); the most recent: {recent}"
        )
    return found[0]


RECENT = 5  # studies a command that will not guess lists


def _described(folder: Path) -> str:
    """`name (model on gpu, written 2026-11-27 10:31)` from the folder's summary.json."""
    written = time.strftime("%Y-%m-%d %H:%M", time.localtime((folder / SUMMARY).stat().st_mtime))
    try:
        summary = json.loads((folder / SUMMARY).read_text())
        what = f"{summary['model']} on {summary['gpu']}, "
    except (OSError, ValueError, KeyError, TypeError):
        what = ""
    return f"{folder.name} ({what}written {written})"
