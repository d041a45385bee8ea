"""The child side of a scan: `python -m autofit.probe.scan REQUEST.json RESULT.json`.

A scan answers one structure (every knob but the batch size) of a simulated search for every
batch in `lo`..`hi` at once: it traces the structure at three batches (the two smallest and the
largest), fits a batch curve through them (autofit/simulator/batch_curve.py), finds the largest
batch that fits, and reports that batch and the one above it with the figures a probe of each
would give. Where the traces do not lie on one line it says so and reports the traced points:
the parent then probes batch by batch. A crash is reported as a probe's would be: a `crash`
result with its traceback, at the batch being traced.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from autofit.probe.spec import Outcome, ProbeResult, ProbeSpec, ScanResult

if TYPE_CHECKING:
    from autofit.simulator.batch_curve import BatchCurve, StepRecord

log = logging.getLogger("autofit.probe.scan")


def at_batch(spec: ProbeSpec, batch: int) -> ProbeSpec:
    return dataclasses.replace(spec, knobs={**spec.knobs, "batch_size": batch})


# Batch 1 is a program of its own: a tensor whose batch dimension has size 1 is contiguous
# whatever its stride, so reshapes and `.contiguous()` that copy at every other batch are views
# there (tiny_sana allocates 1247 times at batch 1, 1273 at 2 and 3). The curve starts at 2;
# batch 1 is traced by itself when the answer needs it.
FIRST_CURVE_BATCH = 2


def curve_batches(lo: int, hi: int) -> list[int]:
    """The batches a scan of `lo`..`hi` traces for its curve: the two smallest from batch 2 on,
    and the largest (every batch, when that range holds three or fewer)."""
    start = max(lo, FIRST_CURVE_BATCH)
    return sorted({b for b in (start, start + 1, hi) if start <= b <= hi})


def trace_point(spec: ProbeSpec, found: dict[str, str]) -> tuple[ProbeResult, StepRecord]:
    """A probe's trace of `spec`: its result, and its record for a batch curve."""
    import torch

    from autofit.backends.simulate import measurement, trace
    from autofit.probe.worker import to_result
    from autofit.simulator.batch_curve import record
    from autofit.simulator.roofline import RooflineCounter

    torch.manual_seed(0)  # as a probe's worker does
    roofline = RooflineCounter(spec.gpu_spec, keep_kernels=True)
    run, tracker = trace(spec, roofline)
    params, trainable = run.param_count, run.trainable_param_count
    figures = measurement(spec, tracker, roofline.cost, params, trainable)
    result = _result(to_result(spec, figures), "traced", found)
    return result, record(spec.knobs["batch_size"], tracker, roofline, params, trainable)


def replayed_point(curve: BatchCurve, spec: ProbeSpec, found: dict[str, str]) -> ProbeResult:
    """What a probe of `spec` would report, answered from `curve` (the same structure)."""
    from autofit.backends.simulate import measurement
    from autofit.probe.worker import to_result

    batch = spec.knobs["batch_size"]
    figures = measurement(
        spec, curve.log_at(batch), curve.cost_at(batch, spec.gpu_spec), curve.param_count,
        curve.trainable_param_count,
    )  # fmt: skip
    return _result(to_result(spec, figures), "replayed", found)


def scan(spec: ProbeSpec, lo: int, hi: int) -> ScanResult:
    """The scan of `spec`'s structure (its batch size is ignored) over `lo`..`hi`."""
    from autofit.backends.base import model_host_memory
    from autofit.probe.worker import versions
    from autofit.simulator.batch_curve import BatchCurve, NotAffine, gpu_fits

    found = versions()
    traced: dict[int, ProbeResult] = {}
    records = []

    def traced_at(batch: int) -> ProbeResult:
        if batch not in traced:
            traced[batch], step = trace_point(at_batch(spec, batch), found)
            records.append(step)
        return traced[batch]

    batches = curve_batches(lo, hi)
    for batch in batches:
        traced_at(batch)
    if len(batches) < 3:  # the range is too short for a curve: trace every batch
        fitting = [b for b in range(hi, lo - 1, -1) if traced_at(b).outcome is Outcome.OK]
        return _reported(lo, hi, max(fitting, default=None), traced_at, sorted(traced))
    try:
        curve = BatchCurve.fit(records)
    except NotAffine as exc:
        log.warning("%s: traced %s, answering batch by batch instead", exc, batches)
        return ScanResult(lo, hi, None, list(traced.values()), sorted(traced), False, str(exc))

    gpu = spec.gpu_spec
    allocator = spec.knobs.get("allocator", "default")
    workspace = [gpu.cublas_workspace_bytes]
    limit = spec.budget_bytes - gpu.cuda_context_bytes

    def fits(batch: int) -> bool:
        if batch in traced or batch < FIRST_CURVE_BATCH:
            return traced_at(batch).outcome is Outcome.OK
        step = curve.log_at(batch)
        if not gpu_fits(step, workspace, limit, allocator):
            return False
        host_budget = spec.host_memory_bytes
        return host_budget is None or (
            model_host_memory(step, at_batch(spec, batch)).peak_bytes <= host_budget
        )

    def replayed(batch: int) -> ProbeResult:
        if batch in traced or batch < FIRST_CURVE_BATCH:
            return traced_at(batch)
        return replayed_point(curve, at_batch(spec, batch), found)

    best = curve.largest_fitting(lo, hi, limit - sum(workspace), fits)
    reported = _reported(lo, hi, best, replayed, [])
    reported.traced = sorted(traced)
    return reported


def _reported(
    lo: int, hi: int, best: int | None, result_at: Callable[[int], ProbeResult], traced: list[int]
) -> ScanResult:
    """The scan's answer with the points it reports: the best batch and the one above it, or
    `lo` when none fits."""
    points = [lo] if best is None else [best] + ([best + 1] if best < hi else [])
    return ScanResult(lo, hi, best, [result_at(b) for b in points], traced)


def _result(result: ProbeResult, source: str, found: dict[str, str]) -> ProbeResult:
    result.source = source
    result.versions = found
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m autofit.probe.scan REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    request_path, result_path = (Path(a) for a in args)
    request = json.loads(request_path.read_text())
    spec = ProbeSpec(**request["spec"])
    lo, hi = request["lo"], request["hi"]
    try:
        answer = scan(spec, lo, hi)
    except Exception as exc:  # a crash is an answer, as a probe's is
        failed = ProbeResult.failed(
            spec, Outcome.CRASH, f"{type(exc).__name__}: {exc}", traceback.format_exc()[-4000:],
            "simulate",
        )  # fmt: skip
        answer = ScanResult(lo, hi, None, [failed], [], False, f"the scan crashed: {exc}")
    tmp = result_path.with_name(result_path.name + ".tmp")
    tmp.write_text(answer.to_json())
    tmp.replace(result_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
