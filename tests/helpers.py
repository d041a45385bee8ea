"""Shared helpers: specs for shipped presets without going through the CLI."""

from __future__ import annotations

from typing import Any

from autofit.gpus import load_gpu
from autofit.models import load_preset
from autofit.probe.build import make_spec
from autofit.probe.spec import ProbeSpec


def spec(model: str, gpu: str = "a40", backend: str = "simulate", **knobs: Any) -> ProbeSpec:
    return make_spec(load_preset(model), load_gpu(gpu), knobs, backend=backend, timeout_s=300)
