"""The configuration an export starts from: one point of a study's results, every knob filled in.

A study leaves `results/<study>/summary.json` (autofit/results/): its `best` run and its
Pareto front, each with `config` holding every knob as applied. Knobs added after a study was
made are absent from its config; they take their registry default, which is what autofit did
before the knob existed (autofit/knobs/base.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autofit.errors import AutofitError, ConfigError, shown
from autofit.knobs import WORKLOAD_KNOBS, completed
from autofit.models import ModelPreset, load_preset
from autofit.results import read_summary

# What every run is trained on: a config without one is not a study's.
REQUIRED = WORKLOAD_KNOBS


@dataclass(frozen=True)
class StudyPoint:
    """One run of a study, as an exporter needs it.

    `config` holds every knob (defaults filled in); `label` says which run it is ("best" or
    "Pareto point N of M"); `accumulation` is the gradient accumulation that keeps the requested
    global batch (1 when none was asked for).
    """

    study: str
    summary_path: Path
    preset: ModelPreset
    gpu: str
    backend: str
    label: str
    config: dict[str, Any]
    peak_bytes: int
    budget_bytes: int
    samples_per_s: float
    accumulation: int = 1
    summary: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def model(self) -> str:
        return self.preset.name

    @property
    def family(self) -> str:
        return self.preset.family

    @property
    def micro_batch(self) -> int:
        return int(self.config["batch_size"])

    @property
    def world_size(self) -> int:
        return int(self.config["world_size"])

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.world_size * self.accumulation


def gradient_accumulation(micro_batch: int, world_size: int, global_batch: int | None) -> int:
    """Accumulation steps that make `global_batch` from the micro-batch that fits on each GPU."""
    if global_batch is None:
        return 1
    per_step = micro_batch * world_size
    valid_int = isinstance(global_batch, int) and not isinstance(global_batch, bool)
    if not valid_int or global_batch < per_step or global_batch % per_step:
        gpus = f"{world_size} GPU{'s' if world_size > 1 else ''}"
        nearest = ""
        if valid_int and global_batch > per_step:
            below = global_batch // per_step * per_step
            nearest = f"; nearest: {below} or {below + per_step}"
        raise ConfigError(
            f"target.global_batch={shown(global_batch)} is not valid: it must be a multiple of the batch "
            f"one step makes, {micro_batch} per GPU x {gpus} = {per_step}{nearest}"
        )
    return global_batch // per_step


def _entry(summary: dict[str, Any], point: int | None, path: Path) -> tuple[str, dict[str, Any]]:
    pareto = summary.get("pareto") or []
    if point is None:
        if not summary.get("best"):
            raise AutofitError(
                f"study {summary.get('study')} has no best configuration (nothing fit the budget, "
                f"see {path}); nothing to export"
            )
        return "best", summary["best"]
    if isinstance(point, bool) or not isinstance(point, int) or not 1 <= point <= len(pareto):
        rows = f"1..{len(pareto)}" if pareto else "none: the front is empty"
        raise ConfigError(
            f"point={shown(point)} is not valid for study {summary.get('study')}: its Pareto front has "
            f"rows {rows} (counted from 1, in the order `autofit search` prints them and "
            f"{path.parent / 'pareto.csv'} lists them)"
        )
    return f"Pareto point {point} of {len(pareto)}", pareto[point - 1]


def load_point(path: Path, point: int | None = None, global_batch: int | None = None) -> StudyPoint:
    """The best run of the study at `path` (or row `point` of its Pareto front, from 1)."""
    summary = read_summary(path)
    label, entry = _entry(summary, point, path)
    config = dict(entry.get("config") or {})
    missing = [k for k in REQUIRED if k not in config]
    if missing:
        raise AutofitError(f"{path}: the {label} run has no {', '.join(missing)} in its config")
    config = completed(config)
    preset = load_preset(summary["model"])
    accumulation = gradient_accumulation(
        int(config["batch_size"]), int(config["world_size"]), global_batch
    )
    return StudyPoint(
        study=summary.get("study") or path.parent.name,
        summary_path=path,
        preset=preset,
        gpu=summary.get("gpu", "?"),
        backend=summary.get("backend", "?"),
        label=label,
        config=config,
        peak_bytes=int(entry.get("peak_bytes") or 0),
        budget_bytes=int(summary.get("budget_bytes") or 0),
        samples_per_s=float(entry.get("samples_per_s") or 0.0),
        accumulation=accumulation,
        summary=summary,
    )
