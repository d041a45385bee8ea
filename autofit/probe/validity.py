"""Combinations that cannot run at all, decided before any probe starts (no torch needed)."""

from __future__ import annotations

from typing import Any

from autofit.gpus import GpuSpec
from autofit.models import ModelPreset
from autofit.techniques import TECHNIQUES
from autofit.techniques.base import ProbeContext


def invalid_reason(
    knobs: dict[str, Any], gpu: GpuSpec, model: ModelPreset, backend: str
) -> str | None:
    """The first technique's reason this configuration cannot run, or None."""
    context = ProbeContext(knobs, gpu, model, backend)
    for technique in TECHNIQUES:
        reason = technique.invalid_reason(knobs[technique.name], context)
        if reason:
            return reason
    return None
