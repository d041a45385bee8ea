"""The `cuda` backend: real training steps on the local GPU, measured as nanoGPT's bench does.

A target GPU with less memory than the local one is emulated by capping this process's share of
the caching allocator (`set_per_process_memory_fraction`), so a probe for a 24 GB card fails on an
80 GB card where the 24 GB card would. The peak comes from the allocator's own statistics
(allocated and reserved); the breakdown from the same tracker the other backends use, over the
first steps; throughput from synchronised wall-clock time over steps run without the tracker.

Host memory is the tracker's ledger (as in the other backends, on real storages), raised to what
the process itself held where that is more: the peak resident set size of the steps (VmHWM,
reset after the build by writing 5 to /proc/self/clear_refs, so autofit's own whole-model
build on the host, which the ledger counts as a trainer's loader would, is not in it) and the
pinned bytes torch's CUDA host allocator owned at its peak (`host_memory_stats`,
"allocated_bytes.peak": active and cached blocks, rounded to powers of two). The process's
figure includes what the ledger does not see (the interpreter, the CUDA libraries, tensors a
library keeps on the CPU); where the kernel cannot reset the peak, only the ledger is used.
autofit's own stand-ins for offload and swap do not pin what they keep on the host: the ledger
says what the trainer would pin, and the allocator's figure only raises it.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from autofit.backends.base import (
    TRACKED_STEPS,
    OutOfMemory,
    host_fields,
)
from autofit.host import host_memory, host_ranks
from autofit.records.measurement import Measurement
from autofit.records.probe import ProbeSpec
from autofit.simulator.roofline import RooflineCounter
from autofit.simulator.tracker import HostReport, MemoryTracker
from autofit.training import TrainingRun

WARMUP_STEPS = 2  # untracked steps before timing: the first ones include allocator growth
TIMED_STEPS = 5


def measure(spec: ProbeSpec) -> Measurement:
    gpu = spec.gpu_spec
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info(device)
    # The CUDA context (and anything else already on this GPU) is outside the allocator's
    # statistics but inside the target's memory.
    context_bytes = total - free
    allocator_limit = spec.budget_bytes - context_bytes
    if allocator_limit <= 0:
        raise OutOfMemory("the CUDA context alone exceeds the budget", "setup")
    torch.cuda.set_per_process_memory_fraction(min(1.0, allocator_limit / total), device)
    torch.cuda.reset_peak_memory_stats(device)

    tracker = MemoryTracker(device_type="cuda")
    flops = RooflineCounter(gpu)
    run = TrainingRun(spec, device, tracker)
    try:
        with tracker:
            run.build()
            rss_reset = _reset_peak_rss()
            for _ in range(TRACKED_STEPS - 1):
                run.step()
            with flops:
                run.step()
            run.finish()
        report = tracker.peak_report()
        run.tracker = None
        for _ in range(WARMUP_STEPS):
            run.step()
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        for _ in range(TIMED_STEPS):
            run.step()
        torch.cuda.synchronize(device)
        step_time = (time.perf_counter() - started) / TIMED_STEPS
    except torch.OutOfMemoryError as exc:
        # The run's phase, not the tracker's: leaving a phase on the error restored the tracker's
        # to the one before (a batch too large for an RTX 4090 read "out of memory in setup").
        raise OutOfMemory(str(exc).splitlines()[0], run.phase if run.tracker else "timing") from exc

    host = _with_process(host_memory(tracker, spec), rss_reset, host_ranks(spec.knobs))
    allocated = torch.cuda.max_memory_allocated(device)
    reserved = torch.cuda.max_memory_reserved(device)
    budget_left = spec.budget_bytes - context_bytes
    return Measurement(
        backend="cuda",
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=reserved,
        required_reserved_bytes=reserved,
        cuda_context_bytes=context_bytes,
        cublas_workspace_bytes=gpu.cublas_workspace_bytes,
        tensor_breakdown=report.breakdown,
        phase_peaks=report.phase_peaks,
        phase=report.phase,
        over_budget_phase=None if reserved <= budget_left else report.phase,
        step_time_s=step_time,
        throughput_estimated=False,
        flops_per_step=flops.cost.flops,
        param_count=run.param_count,
        trainable_param_count=run.trainable_param_count,
        **host_fields(host),
    )


def _reset_peak_rss() -> bool:
    """Reset this process's peak resident set size (Linux 4.0 and later); False if it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def _peak_rss() -> int | None:
    """This process's peak resident set size since the last reset (VmHWM), in bytes."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _with_process(ledger: HostReport, rss_reset: bool, ranks: int) -> HostReport:
    """The ledger's host peak, raised to the process's own readings (one process per GPU)."""
    pinned = int(torch.cuda.host_memory_stats().get("allocated_bytes.peak", 0)) * ranks
    rss = _peak_rss() if rss_reset else None
    steps = rss * ranks if rss is not None else 0
    if max(steps, pinned) <= ledger.peak_bytes:
        return ledger
    peak = max(steps, pinned, ledger.peak_bytes)
    pinned = max(pinned, ledger.pinned_bytes)
    return dataclasses.replace(
        ledger,
        peak_bytes=peak,
        pinned_bytes=pinned,
        pageable_bytes=peak - pinned,
        phase="training steps (measured)",
    )
