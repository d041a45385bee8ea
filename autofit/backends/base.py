"""What a backend hands back, and the memory accounting the CPU backends share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autofit.gpus import GpuSpec
from autofit.host import host_ranks, loader
from autofit.simulator.allocator_replay import required_memory
from autofit.simulator.step_log import HostReport, StepLog

if TYPE_CHECKING:
    from autofit.probe.spec import ProbeSpec

# Steps before measuring: optimizer state appears in the first step, so the second is the first
# to show the steady-state peak (state, then activations and gradients on top of it). The
# simulator traces the first step's forward and backward pass only where the second's cannot
# stand in for it (autofit/simulator/first_step.py).
TRACKED_STEPS = 2


class OutOfMemory(Exception):
    """A real run ran out of memory; `phase` says where."""

    def __init__(self, message: str, phase: str | None) -> None:
        super().__init__(message)
        self.phase = phase


@dataclass(frozen=True)
class Measurement:
    """A backend's figures for one configuration. Memory in bytes, as the CUDA allocator counts:
    `peak_allocated_bytes` includes the cuBLAS workspace; `peak_reserved_bytes` is what the
    allocator held from the driver where memory was plentiful (`max_memory_reserved`);
    `required_reserved_bytes` is the least it needs under a limit, giving its cache back when
    short (measured runs report what they reserved). The CUDA context comes on top.

    Host memory (`host_*`) is the machine's, for the whole run: one process's host bytes times
    the processes sharing the machine (autofit/host.py `host_ranks`), pinned and pageable at the
    host peak, the phase it happened in and each phase's peak (tracker.py `host_report`)."""

    backend: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    required_reserved_bytes: int
    cuda_context_bytes: int
    cublas_workspace_bytes: int
    tensor_breakdown: dict[str, int]  # live tensor bytes per category at the tensor peak
    phase_peaks: dict[str, int]  # the tensor peak within each phase
    phase: str  # where the tensor peak happened
    over_budget_phase: str | None  # where the budget was first exceeded, if it was
    step_time_s: float
    throughput_estimated: bool
    flops_per_step: int
    param_count: int
    trainable_param_count: int
    host_peak_bytes: int = 0
    host_pinned_bytes: int = 0
    host_pageable_bytes: int = 0
    host_phase: str = "setup"
    host_phase_peaks: dict[str, int] = field(default_factory=dict)

    @property
    def peak_bytes(self) -> int:
        return self.required_reserved_bytes + self.cuda_context_bytes

    def breakdown(self) -> dict[str, int]:
        """Tensor categories at the peak, and everything else in `peak_bytes` as `overhead`."""
        tensors = dict(self.tensor_breakdown)
        tensors["overhead"] = self.peak_bytes - sum(self.tensor_breakdown.values())
        return tensors

    def overhead_detail(self) -> dict[str, int]:
        return {
            "cuda_context": self.cuda_context_bytes,
            "cublas_workspace": self.cublas_workspace_bytes,
            "allocator_cache": self.required_reserved_bytes - self.peak_allocated_bytes,
        }


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


def model_host_memory(tracker: StepLog, spec: ProbeSpec) -> HostReport:
    """The host memory of the tracked steps for the whole run: the tracker's host ledger times
    the processes sharing the machine, with the loader's working set as autofit/host.py
    `loader` says (how much each reader holds, and how many processes read)."""
    cap, readers = loader(spec.model["family"], spec.knobs)
    return tracker.host_report(cap, host_ranks(spec.knobs), readers)


def host_fields(host: HostReport) -> dict[str, Any]:
    """A HostReport as Measurement's keyword arguments."""
    return {
        "host_peak_bytes": host.peak_bytes,
        "host_pinned_bytes": host.pinned_bytes,
        "host_pageable_bytes": host.pageable_bytes,
        "host_phase": host.phase,
        "host_phase_peaks": dict(host.phase_peaks),
    }
