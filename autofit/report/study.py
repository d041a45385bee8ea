"""A finished study as its results folder holds it: summary.json and trials.csv.

The files are enough for a report and a comparison (trials.csv has every probe's outcome, phase and
reason), so nothing here opens the Optuna study, and nothing imports more than the standard library.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autofit.errors import AutofitError, ConfigError
from autofit.paths import studies_under
from autofit.units import value as show


@dataclass(frozen=True)
class Probe:
    """One row of trials.csv: a probed configuration, or a combination pruned or invalid without
    a probe (then `batch_size` is None)."""

    outcome: str
    resolution: int
    batch_size: int | None
    knobs: dict[str, Any]
    peak_bytes: int | None
    samples_per_s: float | None
    phase: str
    reason: str

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
        for point in self.pareto:
            resolution = int(point["config"]["resolution"])
            rank = (point["samples_per_s"] or 0.0, -(point["peak_bytes"] or 0))
            held = best.get(resolution)
            if held is None or rank > (held["samples_per_s"] or 0.0, -(held["peak_bytes"] or 0)):
                best[resolution] = point
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


def _knob_value(text: str) -> Any:
    """A knob value from the CSV as the search held it: bools and ints back to their type."""
    if text in ("True", "False", "true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text


def _read_trials(path: Path) -> tuple[list[Probe], list[str]]:
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        # The searched knobs sit between batch_size and peak_gib (search/outputs.py writes them).
        fields = list(reader.fieldnames or [])
        knob_names = fields[fields.index("batch_size") + 1 : fields.index("peak_gib")]
        probes = [
            Probe(
                outcome=row["outcome"],
                resolution=int(row["resolution"]),
                batch_size=_number(row["batch_size"], int),
                knobs={k: _knob_value(row[k]) for k in knob_names},
                peak_bytes=_number(row["peak_bytes"], int),
                samples_per_s=_number(row["samples_per_s"], float),
                phase=row.get("phase") or "",
                reason=row.get("reason") or "",
            )
            for row in reader
        ]
    return probes, knob_names


def load_study(folder: Path) -> Study:
    """Read a results folder of `autofit search`; a one-line error if it is not one."""
    summary_path, trials_path = folder / "summary.json", folder / "trials.csv"
    if not summary_path.is_file():
        raise ConfigError(
            f"{folder} is not a study's results folder: it has no summary.json "
            "(autofit search writes summary.json, trials.csv, pareto.csv and best.yaml there)"
        )
    try:
        summary = json.loads(summary_path.read_text())
        probes, knob_names = _read_trials(trials_path) if trials_path.is_file() else ([], [])
    except (OSError, ValueError, KeyError) as exc:
        raise AutofitError(f"cannot read the study in {folder}: {exc}") from None
    if not isinstance(summary, dict) or "budget_bytes" not in summary:
        raise AutofitError(f"cannot read the study in {folder}: summary.json has no budget_bytes")
    if not knob_names and summary.get("combinations"):
        knob_names = list(summary["combinations"][0]["knobs"])
    return Study(folder, summary, probes, knob_names)


def _names(results: Path) -> str:
    names = sorted(p.name for p in studies_under(results))
    return ", ".join(names) if names else f"none yet under {results}/"


def locate(name: str | None, folder: str | None, results: Path, setting: str = "study") -> Path:
    """The results folder a report reads: `from=DIR` as given, `study=NAME` as results/NAME,
    neither as the most recently written results/*/summary.json."""
    if folder:
        path = Path(folder)
        if not path.is_dir():
            raise ConfigError(f"from={folder}: no such folder")
        return path
    if name:
        return resolve_study(name, results, setting)
    found = studies_under(results)
    if not found:
        raise AutofitError(
            f"no study to report: {results}/ holds no results folder with a summary.json; "
            "run autofit search first, or name one with from=DIR"
        )
    return found[0]


def resolve_study(name: str, results: Path, setting: str) -> Path:
    """A study's name (results/NAME) or a results folder's path."""
    for candidate in (results / name, Path(name)):
        if (candidate / "summary.json").is_file():
            return candidate
    raise ConfigError(
        f"{setting}={name}: no such study (neither {results / name}/summary.json nor "
        f"{name}/summary.json exists); studies: {_names(results)}"
    )
