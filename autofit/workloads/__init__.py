"""The workload of a model family: a preset's `family` names its declaration (autofit/families/),
which names the module whose `WORKLOAD` builds it; configs never name code."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from autofit.families import REGISTRY as FAMILIES  # the families' registry, re-exported
from autofit.families import family

if TYPE_CHECKING:
    from autofit.models import ModelPreset
    from autofit.workloads.base import Workload


def workload_for(preset: ModelPreset, frames: int | None = None) -> Workload:
    """The workload of `preset`'s family; `frames`: a video model's clip length (None: native)."""
    declared = family(preset.family, f"model {preset.name}: ")
    workload_class: type[Workload] = importlib.import_module(declared.workload).WORKLOAD
    return workload_class(preset, frames)


__all__ = ["FAMILIES", "workload_for"]
