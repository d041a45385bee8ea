"""Backends by name. Each runs the same `TrainingRun`; they differ in what the tensors are."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autofit.backends.base import Measurement
    from autofit.gpus import GpuSpec
    from autofit.probe.spec import ProbeSpec

BACKENDS = ("simulate", "cpu", "cuda")


def resolve(requested: str, gpu: GpuSpec, budget_bytes: int) -> str:
    """`auto` means `cuda` when a local GPU can hold the target's budget, else `simulate`."""
    if requested != "auto":
        return requested
    import torch

    if torch.cuda.is_available():
        if torch.cuda.get_device_properties(0).total_memory >= budget_bytes:
            return "cuda"
    return "simulate"


def measure(spec: ProbeSpec, backend: str) -> Measurement:
    if backend == "simulate":
        from autofit.backends import simulate as module
    elif backend == "cpu":
        from autofit.backends import cpu as module  # type: ignore[no-redef]
    elif backend == "cuda":
        from autofit.backends import cuda as module  # type: ignore[no-redef]
    else:
        raise AssertionError(f"unknown backend {backend!r}: specs are validated before this")
    return module.measure(spec)
