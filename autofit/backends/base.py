"""What a backend hands back, and the memory accounting the CPU backends share."""

from __future__ import annotations

from dataclasses import dataclass

from autofit.gpus import GpuSpec
from autofit.memory.allocator import replay
from autofit.memory.tracker import MemoryTracker

# Steps before measuring: optimizer state appears in the first step, so the second is the first
# to show the steady-state peak (state, then activations and gradients on top of it).
TRACKED_STEPS = 2


class OutOfMemory(Exception):
    """A real run ran out of memory; `phase` says where."""

    def __init__(self, message: str, phase: str | None) -> None:
        super().__init__(message)
        self.phase = phase


@dataclass(frozen=True)
class Measurement:
    """A backend's figures for one configuration. Memory in bytes, as the CUDA allocator counts:
    `peak_allocated_bytes` includes the cuBLAS workspace, `peak_reserved_bytes` is what the
    allocator held from the driver, and the CUDA context comes on top of both."""

    backend: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    cuda_context_bytes: int
    cublas_workspace_bytes: int
    tensor_breakdown: dict[str, int]  # live tensor bytes per category at the tensor peak
    phase: str  # where the tensor peak happened
    over_budget_phase: str | None  # where the budget was first exceeded, if it was
    step_time_s: float
    throughput_estimated: bool
    flops_per_step: int
    param_count: int
    trainable_param_count: int

    @property
    def peak_bytes(self) -> int:
        return self.peak_reserved_bytes + self.cuda_context_bytes

    def breakdown(self) -> dict[str, int]:
        """Tensor categories at the peak, and everything else in `peak_bytes` as `overhead`."""
        tensors = dict(self.tensor_breakdown)
        tensors["overhead"] = self.peak_bytes - sum(self.tensor_breakdown.values())
        return tensors

    def overhead_detail(self) -> dict[str, int]:
        return {
            "cuda_context": self.cuda_context_bytes,
            "cublas_workspace": self.cublas_workspace_bytes,
            "allocator_cache": self.peak_reserved_bytes - self.peak_allocated_bytes,
        }


@dataclass(frozen=True)
class ModeledMemory:
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    over_budget_phase: str | None


def model_gpu_memory(tracker: MemoryTracker, gpu: GpuSpec, budget_bytes: int) -> ModeledMemory:
    """What the tracked step would hold on `gpu`: the allocation log replayed through the caching
    allocator model with the cuBLAS workspace, plus where the budget was first exceeded."""
    workspace = gpu.cublas_workspace_bytes
    limit = budget_bytes - gpu.cuda_context_bytes
    replayed = replay(tracker.events, tracker.sizes, persistent=[workspace], limit=limit)
    over = replayed.first_over_limit
    return ModeledMemory(
        peak_allocated_bytes=tracker.peak + workspace,
        peak_reserved_bytes=replayed.peak_reserved_bytes,
        over_budget_phase=None if over is None else tracker.phase_at(max(over, 0)),
    )
