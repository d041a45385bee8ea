"""What a backend hands back for one configuration: its `Measurement`."""

from __future__ import annotations

from dataclasses import dataclass, field


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
