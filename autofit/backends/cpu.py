"""The `cpu` backend: the same training step executed for real on the CPU, for small models.

It is the ground truth the simulator is tested against on machines without a GPU: the same
tracker counts real tensors instead of fake ones (with CUDA's autocast policy, as in `simulate`),
so the two must agree on the allocated peak to the byte. Memory is accounted for the target GPU
exactly as `simulate` accounts it; throughput is this CPU's own, from wall-clock time over steps
run without the tracker.

Host memory too is counted as `simulate` counts it, from the tracker's host ledger (the storages
made inside `host()`, pinned ones rounded as torch's CUDA host allocator would round them, though
nothing is pinned here): this process's own resident memory holds the stand-ins for GPU tensors as
well, so it says nothing about the host of the GPU run this stands for. For the same reason a CPU
probe gets no host budget unless `host_memory_gib=` states one.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import torch

from autofit.backends.base import (
    TRACKED_STEPS,
    host_fields,
    model_gpu_memory,
)
from autofit.host import host_memory
from autofit.records.measurement import Measurement
from autofit.records.probe import ProbeSpec
from autofit.simulator import cuda_autocast
from autofit.simulator.roofline import RooflineCounter
from autofit.simulator.tracker import MemoryTracker
from autofit.training import TrainingRun

TIMED_STEPS = 3


def trace(
    spec: ProbeSpec, counter: RooflineCounter | None = None
) -> tuple[TrainingRun, MemoryTracker]:
    """Build and step the run on real CPU tensors under a tracker (as `simulate.trace` does)."""
    cuda_autocast.install()
    tracker = MemoryTracker(device_type="cpu")
    run = TrainingRun(spec, torch.device("cpu"), tracker)
    with tracker:
        run.build()
        for _ in range(TRACKED_STEPS - 1):
            run.step()
        with counter or nullcontext():
            run.step()
        run.finish()
    return run, tracker


def measure(spec: ProbeSpec) -> Measurement:
    gpu = spec.gpu_spec
    flops = RooflineCounter(gpu)  # for its FLOP count; the time is measured, not estimated
    run, tracker = trace(spec, flops)
    memory = model_gpu_memory(
        tracker, gpu, spec.budget_bytes, spec.knobs.get("allocator", "default")
    )
    report = tracker.peak_report()

    run.tracker = None  # time the step without the tracker's bookkeeping
    started = time.perf_counter()
    for _ in range(TIMED_STEPS):
        run.step()
    step_time = (time.perf_counter() - started) / TIMED_STEPS

    return Measurement(
        backend="cpu",
        peak_allocated_bytes=memory.peak_allocated_bytes,
        peak_reserved_bytes=memory.reserved_when_plentiful,
        required_reserved_bytes=memory.required_reserved,
        cuda_context_bytes=gpu.cuda_context_bytes,
        cublas_workspace_bytes=gpu.cublas_workspace_bytes,
        tensor_breakdown=report.breakdown,
        phase_peaks=report.phase_peaks,
        phase=report.phase,
        over_budget_phase=memory.over_budget_phase,
        step_time_s=step_time,
        throughput_estimated=False,
        flops_per_step=flops.cost.flops,
        param_count=run.param_count,
        trainable_param_count=run.trainable_param_count,
        **host_fields(host_memory(tracker, spec)),
    )
