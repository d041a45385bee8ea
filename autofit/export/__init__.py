"""Exporters: the best configuration of a study (or any Pareto point), in each trainer's own files.

`TARGETS` is the registry: a target's name to its `Target` (autofit/export/base.py says what a
target must do). `export` plans one export and writes it. Nothing here imports torch.
"""

from __future__ import annotations

from autofit.config import suggest
from autofit.errors import ConfigError
from autofit.export.accelerate import TARGET as ACCELERATE
from autofit.export.base import ExportPlan, Target
from autofit.export.deepspeed import TARGET as DEEPSPEED
from autofit.export.diffusers import TARGET as DIFFUSERS
from autofit.export.hydra import TARGET as HYDRA
from autofit.export.kohya import TARGET as KOHYA
from autofit.export.output import write_export
from autofit.export.point import StudyPoint, find_summary, load_point
from autofit.export.sana import TARGET as SANA
from autofit.export.simpletuner import TARGET as SIMPLETUNER

TARGETS: dict[str, Target] = {
    t.name: t for t in (ACCELERATE, DEEPSPEED, SIMPLETUNER, KOHYA, SANA, DIFFUSERS, HYDRA)
}


def target(name: object) -> Target:
    """The target called `name`, or a ConfigError listing the valid ones."""
    valid = ", ".join(TARGETS)
    if name is None:
        raise ConfigError(f"no target given: add target=<name>; valid targets: {valid}")
    if name not in TARGETS:
        hint = suggest(str(name), list(TARGETS))
        raise ConfigError(f"unknown target '{name}'{hint}; valid targets: {valid}")
    return TARGETS[str(name)]


__all__ = [
    "TARGETS",
    "ExportPlan",
    "StudyPoint",
    "Target",
    "find_summary",
    "load_point",
    "target",
    "write_export",
]
