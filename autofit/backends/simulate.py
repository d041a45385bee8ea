"""The `simulate` backend: the real training step on fake tensors, priced for a GPU.

The step runs under PyTorch's FakeTensorMode on the CPU device (fake `cuda` tensors fail in
CUDA-less builds, and fake `meta` tensors send attention down the math path), so no memory is
allocated and no math is done, yet every op sees real shapes and dtypes. What a GPU would do is
mimicked on purpose, in three places:

- autocast: CUDA's cast policy replaces the CPU's (simulator/cuda_autocast.py);
- kernels: where a meta function allocates differently from the real kernel, the real layout is
  used (simulator/kernel_outputs.py);
- attention: the CPU's flash kernel is what SDPA dispatches to here; it keeps the output and a
  float32 log-sum-exp per query, as the GPU's flash and memory-efficient kernels do, never the
  full attention matrix;
- memory: allocations are rounded as the CUDA allocator rounds them, replayed through a model of
  its caching (simulator/allocator.py), and the CUDA context and cuBLAS workspace of the GPU's entry added.

Throughput is a roofline estimate over the ops of one steady-state step (simulator/roofline.py).

Of the two tracked steps, the first is traced as its update alone where the second step's
forward and backward pass can stand in for its own (fastpath/first_step.py): the log is the
two full steps', in about 0.6 of the time (benchmarks/probe_speed.py).
"""

from __future__ import annotations

import dataclasses
import logging
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from autofit.backends.base import (
    TRACKED_STEPS,
    host_fields,
    model_gpu_memory,
)
from autofit.fastpath.first_step import Pass, assemble, cut
from autofit.host import host_memory
from autofit.records.measurement import Measurement
from autofit.records.probe import ProbeSpec
from autofit.simulator import cuda_autocast
from autofit.simulator.fake_modules import module_moves_are_noops
from autofit.simulator.kernel_outputs import RealLayoutFakeMode
from autofit.simulator.roofline import RooflineCounter, StepCost
from autofit.simulator.step_log import StepLog, StepMarks
from autofit.simulator.tracker import MemoryTracker
from autofit.training import TrainingRun

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Traced:
    """A simulated run's two tracked steps: the run, their log, and the second step's pass where
    the log was assembled from it (fastpath/first_step.py: another structure's updates may be
    assembled with it)."""

    run: TrainingRun
    log: StepLog
    pass_: Pass | None


def trace(spec: ProbeSpec, roofline: RooflineCounter | None = None) -> tuple[TrainingRun, StepLog]:
    """Build and step the run on fake tensors under a tracker; price the last step if asked."""
    traced = traced_steps(spec, roofline)
    return traced.run, traced.log


def traced_steps(spec: ProbeSpec, roofline: RooflineCounter | None = None) -> Traced:
    """The run's two steps, the first traced as its update alone where the log of both can be
    assembled from the second's pass (fastpath/first_step.py), else both traced whole."""
    run, tracker, marks = trace_run(spec, roofline, alone=1)
    if marks is not None:
        first, second = marks
        kernels = roofline.kernels if roofline else None
        pass_ = cut(tracker, second, kernels)
        steps = pass_ and assemble(tracker, first, second, pass_, kernels)
        same_step = roofline is None or (
            steps is not None
            and steps.ops == roofline.cost.ops
            and (kernels is None or len(steps.kernels) == len(kernels))
        )  # every kernel and op of the step is in one of its parts
        if steps and same_step:
            if kernels is not None:
                kernels[:] = steps.kernels  # the same kernels, at their places in the new log
            return Traced(run, steps.log, pass_)
        log.info("the second step's pass cannot stand in for the first's: tracing both whole")
        if roofline:
            roofline.reset()
        run, tracker, _ = trace_run(spec, roofline, alone=0)
    return Traced(run, tracker, None)


def built(spec: ProbeSpec) -> TrainingRun:
    """The run built on fake tensors and not stepped: its model, adapters and optimizer as the
    first step finds them (what a count of its parameters needs, without a step's trace)."""
    cuda_autocast.install()
    run = TrainingRun(spec, torch.device("cpu"), MemoryTracker(device_type="meta"), fake=True)
    with RealLayoutFakeMode(allow_non_fake_inputs=True), module_moves_are_noops():
        run.build()
    return run


def trace_run(
    spec: ProbeSpec, roofline: RooflineCounter | None, alone: int
) -> tuple[TrainingRun, MemoryTracker, tuple[StepMarks, StepMarks] | None]:
    """The run built and stepped twice under a tracker, the second step priced if asked; the
    first `alone` steps' updates (0, 1 or 2) from gradients made directly, where the run's own
    loop updates (TrainingRun.can_update_without_a_pass), each step's marks then returned."""
    cuda_autocast.install()
    tracker = MemoryTracker(device_type="meta")  # a fake tensor's storage is on the meta device
    # Created outside fake mode: it imports the model library, whose constants must stay real.
    run = TrainingRun(spec, torch.device("cpu"), tracker, fake=True)
    # Constants some models build from numpy are real tensors; fake mode may take them as inputs.
    with (
        RealLayoutFakeMode(allow_non_fake_inputs=True),
        module_moves_are_noops(),
        tracker,
    ):
        run.build()
        alone = alone if run.can_update_without_a_pass() else 0
        steps = [run.update_without_a_pass if alone > n else run.step for n in range(2)]
        first = steps[0]()
        for _ in range(TRACKED_STEPS - 2):
            run.step()
        before = dataclasses.replace(run.traffic)
        first_exchange = len(run.traffic.exchanges)
        if roofline:
            run.traffic.clock = lambda: roofline.cost.device_seconds
            roofline.where = lambda: len(tracker.events)
            run.priced = lambda: (len(roofline.kernels or ()), roofline.cost.ops)
        with roofline or nullcontext():  # the last step is the steady state
            second = steps[1]()
        if roofline:
            roofline.add_traffic(
                run.traffic.link_bytes - before.link_bytes,
                run.traffic.host_compute_bytes - before.host_compute_bytes,
                run.traffic.peer_bytes - before.peer_bytes,
                run.traffic.exchanges[first_exchange:],
                run.traffic.nvme_bytes - before.nvme_bytes,
                run.traffic.nvme_step_bytes - before.nvme_step_bytes,
            )
        run.finish()
    if not alone:
        return run, tracker, None
    assert first is not None and second is not None
    return run, tracker, (first, second)


def measure(spec: ProbeSpec) -> Measurement:
    roofline = RooflineCounter(spec.gpu_spec)
    run, tracker = trace(spec, roofline)
    return measurement(spec, tracker, roofline.cost, run.param_count, run.trainable_param_count)


def measurement(
    spec: ProbeSpec, log: StepLog, cost: StepCost, param_count: int, trainable_param_count: int
) -> Measurement:
    """The figures of a simulated run from its steps' allocation log and priced step, traced
    (`measure`) or answered from a batch curve (autofit/fastpath/batch_curve.py)."""
    gpu = spec.gpu_spec
    memory = model_gpu_memory(log, gpu, spec.budget_bytes, spec.knobs.get("allocator", "default"))
    report = log.peak_report()
    return Measurement(
        backend="simulate",
        peak_allocated_bytes=memory.peak_allocated_bytes,
        peak_reserved_bytes=memory.reserved_when_plentiful,
        required_reserved_bytes=memory.required_reserved,
        cuda_context_bytes=gpu.cuda_context_bytes,
        cublas_workspace_bytes=gpu.cublas_workspace_bytes,
        tensor_breakdown=report.breakdown,
        phase_peaks=report.phase_peaks,
        phase=report.phase,
        over_budget_phase=memory.over_budget_phase,
        step_time_s=cost.step_seconds,
        throughput_estimated=True,
        flops_per_step=cost.flops,
        param_count=param_count,
        trainable_param_count=trainable_param_count,
        **host_fields(host_memory(log, spec)),
    )
