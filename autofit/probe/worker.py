"""The child side of a probe: `python -m autofit.probe.worker SPEC.json RESULT.json`.

Reads a spec, measures it with the chosen backend, writes a result and exits 0. Running out of
memory is recognised by exception type and is an answer (`oom`); any other exception is a `crash`
with its traceback. A worker that dies before writing is the parent's to report.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any

import autofit
from autofit.backends import measure, resolve
from autofit.backends.base import OutOfMemory
from autofit.models import ModelPreset
from autofit.probe.libraries import crash_message, leave_out_unused
from autofit.records.measurement import Measurement
from autofit.records.probe import Outcome, ProbeResult, ProbeSpec

log = logging.getLogger("autofit.probe.worker")


def versions() -> dict[str, str]:
    import torch

    found = {
        "autofit": autofit.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    for package in ("diffusers", "transformers"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            pass
    if torch.cuda.is_available():
        found["cuda"] = str(torch.version.cuda)
        found["device"] = torch.cuda.get_device_name(0)
    return found


def samples_per_second(knobs: dict[str, Any], step_time_s: float) -> float | None:
    """A run's throughput: every GPU of the run trains its own micro-batch of `batch_size`."""
    if step_time_s <= 0:
        return None
    return knobs["batch_size"] * knobs.get("world_size", 1) / step_time_s


def to_result(spec: ProbeSpec, measured: Measurement) -> ProbeResult:
    batch = spec.knobs["batch_size"]
    fits = measured.peak_bytes <= spec.budget_bytes
    host_budget = spec.host_memory_bytes
    # The GPU first: a run over both budgets is `oom`, as it would stop there first.
    over_host = fits and host_budget is not None and measured.host_peak_bytes > host_budget
    if not fits:
        outcome, phase = Outcome.OOM, measured.over_budget_phase or measured.phase
    elif over_host:
        outcome, phase = Outcome.OOM_HOST, _first_over(measured.host_phase_peaks, host_budget)
    else:
        outcome, phase = Outcome.OK, measured.phase
    preset = ModelPreset.from_dict(spec.model)
    units = preset.units_per_sample(spec.knobs["resolution"])
    samples_per_s = samples_per_second(spec.knobs, measured.step_time_s)
    return ProbeResult(
        outcome=outcome,
        backend=measured.backend,
        gpu=spec.gpu["name"],
        model=spec.model["name"],
        config=dict(spec.knobs),
        budget_bytes=spec.budget_bytes,
        peak_bytes=measured.peak_bytes,
        peak_allocated_bytes=measured.peak_allocated_bytes,
        peak_reserved_bytes=measured.peak_reserved_bytes,
        breakdown=measured.breakdown(),
        overhead_detail=measured.overhead_detail(),
        phase=phase,
        phase_peaks=measured.phase_peaks,
        host_peak_bytes=measured.host_peak_bytes,
        host_pinned_bytes=measured.host_pinned_bytes,
        host_pageable_bytes=measured.host_pageable_bytes,
        host_phase=measured.host_phase,
        host_budget_bytes=host_budget,
        samples_per_s=samples_per_s,
        tokens_per_s=samples_per_s * units if samples_per_s and preset.unit == "tokens" else None,
        units_per_sample=units,
        step_time_s=measured.step_time_s,
        throughput_estimated=measured.throughput_estimated,
        flops_per_sample=measured.flops_per_step / batch,
        param_count=measured.param_count,
        trainable_param_count=measured.trainable_param_count,
    )


def _first_over(phase_peaks: dict[str, int], budget: int) -> str | None:
    """The first phase whose peak is over `budget` (phase peaks are in the order phases ran)."""
    return next((phase for phase, peak in phase_peaks.items() if peak > budget), None)


def execute(spec: ProbeSpec) -> ProbeResult:
    import torch

    torch.manual_seed(0)
    backend = resolve(spec.backend, spec.gpu_spec, spec.budget_bytes)
    log.info(
        "probing %s on %s with %s: %s", spec.model["name"], spec.gpu["name"], backend, spec.knobs
    )
    try:
        result = to_result(spec, measure(spec, backend))
    except OutOfMemory as exc:
        result = ProbeResult.failed(spec, Outcome.OOM, str(exc), backend=backend)
        result.phase = exc.phase
    except torch.OutOfMemoryError as exc:
        result = ProbeResult.failed(spec, Outcome.OOM, str(exc).splitlines()[0], backend=backend)
    except Exception as exc:  # anything else is a crash, reported with its traceback
        result = ProbeResult.failed(
            spec,
            Outcome.CRASH,
            crash_message(exc),
            traceback.format_exc()[-4000:],
            backend,
        )
    result.versions = versions()
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m autofit.probe.worker SPEC.json RESULT.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    spec_path, result_path = (Path(a) for a in args)
    spec = ProbeSpec.from_json(spec_path.read_text())
    leave_out_unused([spec])
    execute(spec).write(result_path)
    return 0


def exit_now(code: int) -> None:
    """End the worker without the interpreter's teardown, which frees every object of torch and
    the model libraries one by one: 1.5 to 2.5 s on a 2-core machine (most of it after the exit
    handlers, which take milliseconds), for nothing, as the result is written and the worker's
    process group ends with it. Streams and log handlers are flushed first; the fork server's
    children end the same way (autofit/probe/forkserver.py)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
