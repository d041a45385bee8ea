"""What a backend hands back, and the memory accounting the CPU backends share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autofit.gpus import GpuSpec
from autofit.simulator.allocator_replay import required_memory
from autofit.simulator.step_log import HostReport, StepLog

# Steps before measuring: optimizer state appears in the first step, so the second is the first
# to show the steady-state peak (state, then activations and gradients on top of it). The
# simulator traces the first step's forward and backward pass only where the second's cannot
# stand in for it (autofit/fastpath/first_step.py).
TRACKED_STEPS = 2


class OutOfMemory(Exception):
    """A real run ran out of memory; `phase` says where."""

    def __init__(self, message: str, phase: str | None) -> None:
        super().__init__(message)
        self.phase = phase


@dataclass(frozen=True)
class ModeledMemory:
    peak_allocated_bytes: int  # tensors and the cuBLAS workspace, as CUDA counts them
    reserved_when_plentiful: int  # the allocator's reserved peak with memory to spare
    required_reserved: int  # the least the allocator needs (it gives back its cache when short)
    over_budget_phase: str | None  # where the run runs out of the budget, if it does


def model_gpu_memory(
    tracker: StepLog, gpu: GpuSpec, budget_bytes: int, allocator: str = "default"
) -> ModeledMemory:
    """What the tracked steps would hold on `gpu`: the allocation log replayed through the
    caching-allocator model for the `allocator` knob's setting with the cuBLAS workspace, under
    the budget less the CUDA context."""
    workspace = gpu.cublas_workspace_bytes
    limit = budget_bytes - gpu.cuda_context_bytes
    known = tracker.plentiful_reserved.get(((workspace,), allocator))
    need = required_memory(
        tracker.events, tracker.sizes, [workspace], limit, allocator, known, tracker.streams
    )
    over = need.oom_event
    return ModeledMemory(
        peak_allocated_bytes=tracker.peak + workspace,
        reserved_when_plentiful=need.reserved_when_plentiful,
        required_reserved=need.required,
        over_budget_phase=None if over is None else tracker.phase_at(max(over, 0)),
    )


def host_fields(host: HostReport) -> dict[str, Any]:
    """A HostReport as Measurement's keyword arguments."""
    return {
        "host_peak_bytes": host.peak_bytes,
        "host_pinned_bytes": host.pinned_bytes,
        "host_pageable_bytes": host.pageable_bytes,
        "host_phase": host.phase,
        "host_phase_peaks": dict(host.phase_peaks),
    }
