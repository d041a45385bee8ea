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
forward and backward pass can stand in for its own (simulator/first_step.py): the log is the
two full steps', in about 0.6 of the time (benchmarks/probe_speed.py).
"""

from __future__ import annotations

import dataclasses
import logging
from contextlib import nullcontext

import torch

from autofit.backends.base import (
    TRACKED_STEPS,
    Measurement,
    host_fields,
    model_gpu_memory,
    model_host_memory,
)
from autofit.probe.spec import ProbeSpec
from autofit.simulator import cuda_autocast
from autofit.simulator.fake_modules import module_moves_are_noops
from autofit.simulator.first_step import compact_phases, splice
from autofit.simulator.kernel_outputs import RealLayoutFakeMode
from autofit.simulator.roofline import RooflineCounter, StepCost
from autofit.simulator.step_log import StepLog
from autofit.simulator.tracker import MemoryTracker
from autofit.training import TrainingRun

log = logging.getLogger(__name__)


def trace(spec: ProbeSpec, roofline: RooflineCounter | None = None) -> tuple[TrainingRun, StepLog]:
    """Build and step the run on fake tensors under a tracker; price the last step if asked.
    The first step is traced as its update alone where the log of both steps can be written
    from the second's pass (autofit/simulator/first_step.py); else both are traced whole."""
    cuda_autocast.install()
    traced = _trace(spec, roofline, one_pass=True)
    if traced is None:
        log.info("the step's pass leaves state behind it: tracing both steps whole")
        if roofline:
            roofline.reset()
        traced = _trace(spec, roofline, one_pass=False)
    return traced


def _trace(
    spec: ProbeSpec, roofline: RooflineCounter | None, one_pass: bool
) -> tuple[TrainingRun, StepLog] | None:
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
        one_pass = one_pass and run.can_update_without_a_pass()
        if one_pass:
            first = run.update_without_a_pass()
        else:
            for _ in range(TRACKED_STEPS - 1):
                run.step()
        before = dataclasses.replace(run.traffic)
        first_exchange = len(run.traffic.exchanges)
        if roofline:
            run.traffic.clock = lambda: roofline.cost.device_seconds
            roofline.where = lambda: len(tracker.events)
        with roofline or nullcontext():  # the last step is the steady state
            second = run.step()
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
    # Phase changes in one form whichever way the steps were traced, so that traces compare.
    tracker.phase_changes = compact_phases(tracker.phase_changes)
    if not one_pass:
        return run, tracker
    assert second is not None
    spliced = splice(tracker, first, second)
    if spliced is None:
        return None
    steps, shift = spliced
    if roofline:
        roofline.moved(shift)
    return run, steps


def measure(spec: ProbeSpec) -> Measurement:
    roofline = RooflineCounter(spec.gpu_spec)
    run, tracker = trace(spec, roofline)
    return measurement(spec, tracker, roofline.cost, run.param_count, run.trainable_param_count)


def measurement(
    spec: ProbeSpec, log: StepLog, cost: StepCost, param_count: int, trainable_param_count: int
) -> Measurement:
    """The figures of a simulated run from its steps' allocation log and priced step, traced
    (`measure`) or answered from a batch curve (autofit/simulator/batch_curve.py)."""
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
        **host_fields(model_host_memory(log, spec)),
    )
