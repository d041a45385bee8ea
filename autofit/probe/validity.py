"""Combinations that cannot run at all, decided before any probe starts (no torch needed)."""

from __future__ import annotations

from typing import Any

from autofit.gpus import GpuSpec
from autofit.models import ModelPreset
from autofit.techniques import TECHNIQUES


def invalid_reason(knobs: dict[str, Any], gpu: GpuSpec, model: ModelPreset) -> str | None:
    """The first technique's reason this configuration cannot run on `gpu`, or None."""
    for technique in TECHNIQUES:
        reason = technique.invalid_reason(knobs[technique.name], knobs, gpu, model)
        if reason:
            return reason
    return None
