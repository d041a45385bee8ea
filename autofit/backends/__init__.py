"""Backends by name. Each runs the same `TrainingRun`; they differ in what the tensors are."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autofit.devices import nvidia_device_visible
from autofit.errors import ConfigError
from autofit.records.measurement import Measurement
from autofit.records.probe import ProbeSpec
from autofit.units import size

if TYPE_CHECKING:
    from autofit.gpus import GpuSpec

BACKENDS = ("simulate", "cpu", "cuda")


def resolve(requested: str, gpu: GpuSpec, budget_bytes: int) -> str:
    """`auto` means `cuda` when a local GPU can hold the target's budget, else `simulate`.
    `cuda` where no local GPU can run the target's probes is a one-line ConfigError, before any
    probe: each would crash the same way."""
    if requested == "cuda":
        why = cuda_unusable() or _too_small(gpu, budget_bytes)
        if why:
            raise ConfigError(
                f"backend=cuda cannot run here: {why}; backend=simulate estimates the run "
                "without a GPU (backend=auto uses the local GPU where it can hold the budget)"
            )
        return requested
    if requested != "auto":
        return requested
    if not nvidia_device_visible():
        return "simulate"  # without importing torch (seconds of start-up) to learn it
    import torch

    if torch.cuda.is_available():
        if torch.cuda.get_device_properties(0).total_memory >= budget_bytes:
            return "cuda"
    return "simulate"


def cuda_unusable() -> str | None:
    """Why torch cannot run anything on a local CUDA device, in its own words where it has them,
    or None."""
    import torch

    if not torch.backends.cuda.is_built():
        return f"torch {torch.__version__} was built without CUDA"
    try:
        torch.cuda.init()
    except Exception as exc:  # torch's words for it: no driver, a driver too old, no device
        lines = str(exc).strip().splitlines()
        return f"CUDA did not start ({lines[0] if lines else type(exc).__name__})"
    return None


def _too_small(gpu: GpuSpec, budget_bytes: int) -> str | None:
    """Why the local GPU cannot stand for `gpu`: the cuda backend emulates a smaller card by
    capping its share of the allocator (autofit/backends/cuda.py), never a larger one."""
    import torch

    local = torch.cuda.get_device_properties(0)
    if local.total_memory >= budget_bytes:
        return None
    return (
        f"the local {local.name} has {size(local.total_memory)}, less than the {size(budget_bytes)} "
        f"budget of {gpu.name} (the cuda backend emulates only smaller cards, by capping the "
        "memory it may use)"
    )


def measure(spec: ProbeSpec, backend: str) -> Measurement:
    # lazy: a backend imports torch; the search's own process imports this package without it
    if backend == "simulate":
        from autofit.backends import simulate as module
    elif backend == "cpu":
        from autofit.backends import cpu as module  # type: ignore[no-redef]
    elif backend == "cuda":
        from autofit.backends import cuda as module  # type: ignore[no-redef]
    else:
        raise AssertionError(f"unknown backend {backend!r}: specs are validated before this")
    return module.measure(spec)
