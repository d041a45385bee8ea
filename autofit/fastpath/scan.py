"""The child side of a scan: `python -m autofit.fastpath.scan REQUEST.json RESULT.json`.

A scan answers structures (every knob but the batch size) of a simulated search for every batch
in their ranges `lo`..`hi` at once. Each structure is traced at the largest batch first: when
that fits, it is the answer. Otherwise a batch curve (autofit/fastpath/batch_curve.py) answers
every batch: the first structure of a group fits its own through three traces (2, 3 and the
largest); the others, which differ only in knobs that add nothing per sample, take the first's
growth where their steps agree. Each scan finds the largest batch that fits and reports that
batch and the one above it with the figures a probe of each would give, and with a window
(ScanWindow, at the search's target resolution) every batch the search's best rule weighs.
Where the traces do not lie on one line it says so and reports the traced points: the parent
then probes batch by batch.
A crash is reported as a probe's would be: a `crash` result with its traceback, for the
structure being scanned.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from autofit.backends.simulate import measurement, traced_steps
from autofit.fastpath.batch_curve import BatchCurve, NotAffine, gpu_fits, record
from autofit.fastpath.shared_updates import SharedUpdates, composed_steps
from autofit.host import host_memory
from autofit.knobs import registry
from autofit.paths import write_atomically
from autofit.probe.libraries import crash_message, leave_out_unused
from autofit.probe.worker import exit_now, samples_per_second, to_result, versions
from autofit.records.probe import Outcome, ProbeResult, ProbeSpec, ScanResult, ScanWindow
from autofit.simulator.roofline import RooflineCounter, StepCost
from autofit.simulator.step_log import StepLog

log = logging.getLogger("autofit.fastpath.scan")


# Batch 1 is a program of its own: a tensor whose batch dimension has size 1 is contiguous
# whatever its stride, so reshapes and `.contiguous()` that copy at every other batch are views
# there (tiny_sana allocates 1247 times at batch 1, 1273 at 2 and 3). The curve starts at 2;
# batch 1 is traced by itself when the answer needs it.
FIRST_CURVE_BATCH = 2
# The most batches a scan reports for the best rule's window (ScanWindow): as many as the
# default spaces' whole range. A replay costs about 35 ms (Sana 1600M), a probe the search would
# make instead seconds; but a small model whose speed has long levelled off may have thousands
# of batches within the tolerance, and those the search bisects with probes.
WINDOW_LIMIT = 64


def curve_batches(lo: int, hi: int) -> list[int]:
    """The batches a scan of `lo`..`hi` traces for its curve: the two smallest from batch 2 on,
    and the largest (every batch, when that range holds three or fewer)."""
    start = max(lo, FIRST_CURVE_BATCH)
    return sorted({b for b in (start, start + 1, hi) if start <= b <= hi})


class TracedPoint:
    """A batch traced for a curve: its record, and its result, computed when asked (a traced
    batch far over the budget costs a search for the least limit it would need, which only a
    reported point is worth). With `pass_from`, a point of another structure at the same batch
    with the same forward and backward pass (`same_pass`), it is assembled from that pass and
    its own setup and updates where it can be (autofit/fastpath/first_step.py), those taken
    from `shared` where another scan of the search traced them."""

    def __init__(
        self,
        spec: ProbeSpec,
        found: dict[str, str],
        pass_from: TracedPoint | None = None,
        shared: SharedUpdates | None = None,
    ) -> None:

        torch.manual_seed(0)  # as a probe's worker does
        roofline = RooflineCounter(spec.gpu_spec, keep_kernels=True)
        self.pass_ = pass_from.pass_ if pass_from is not None else None
        updates = (shared or SharedUpdates(None)).updates(spec) if self.pass_ else None
        log = composed_steps(updates, self.pass_, roofline) if updates and self.pass_ else None
        if updates is not None and log is not None:
            self.log, (self.params, self.trainable) = log, updates.counts
        else:
            roofline.reset()
            traced = traced_steps(spec, roofline)
            run, self.log, self.pass_ = traced.run, traced.log, traced.pass_
            self.params, self.trainable = run.param_count, run.trainable_param_count
        self.spec, self.found, self.cost = spec, found, roofline.cost
        self.record = record(spec.knobs["batch_size"], self.log, roofline, *self.counts)
        self._result: ProbeResult | None = None

    @property
    def counts(self) -> tuple[int, int]:
        return self.params, self.trainable

    def result(self) -> ProbeResult:
        if self._result is None:
            figures = measurement(self.spec, self.log, self.cost, *self.counts)
            self._result = _result(to_result(self.spec, figures), "traced", self.found)
        return self._result


def same_pass(one: ProbeSpec, other: ProbeSpec) -> bool:
    """Whether two structures run the same forward and backward pass: they differ only in knobs
    that change what the update does or what runs after training (Knob.changes_pass_between)."""

    knobs = registry()
    differ = {k for k in {*one.knobs, *other.knobs} if one.knobs.get(k) != other.knobs.get(k)}
    differ.discard("batch_size")
    same_run = one.model == other.model and one.gpu == other.gpu
    return same_run and not any(
        knobs[k].changes_pass_between(one.knobs.get(k), other.knobs.get(k)) for k in differ
    )


def replayed_point(
    curve: BatchCurve,
    spec: ProbeSpec,
    found: dict[str, str],
    log: StepLog | None = None,
    cost: StepCost | None = None,
) -> ProbeResult:
    """What a probe of `spec` would report, answered from `curve` (the same structure); `log`
    and `cost`: the curve's at its batch, where the caller has them."""

    batch = spec.knobs["batch_size"]
    figures = measurement(
        spec,
        curve.log_at(batch) if log is None else log,
        curve.cost_at(batch, spec.gpu_spec) if cost is None else cost,
        curve.param_count, curve.trainable_param_count,
    )  # fmt: skip
    return _result(to_result(spec, figures), "replayed", found)


class _Scan:
    """One structure's scan: its traced points, its curve, its answer over `lo`..`hi`, and with a
    `window`, the batches in it (ScanWindow), from its `min_batch` up."""

    def __init__(
        self,
        spec: ProbeSpec,
        lo: int,
        hi: int,
        found: dict[str, str],
        window: ScanWindow | None = None,
        shared: SharedUpdates | None = None,
    ) -> None:
        self.spec, self.lo, self.hi, self.found = spec, lo, hi, found
        self.updates = shared  # where setups and updates are shared (TracedPoint)
        self.window = window
        self.traced: dict[int, TracedPoint] = {}
        self.lender: _Scan | None = None  # the first structure of its group, once it has scanned
        self.curve: BatchCurve | None = None
        self.shared = False  # the curve's growth came from another structure's
        self.reason = ""  # why the traces do not lie on one line, once they did not
        gpu = spec.gpu_spec
        self.workspace = [gpu.cublas_workspace_bytes]
        self.limit = spec.budget_bytes - gpu.cuda_context_bytes  # the allocator's

    @property
    def lowest(self) -> int:
        """The smallest batch the scan looks at: `lo`, or the window's least batch below it (a
        memory-saving structure's range starts above its parent's largest batch, but the best
        rule weighs it at every batch)."""
        return self.lo if self.window is None else min(self.lo, max(self.window.min_batch, 1))

    def traced_at(self, batch: int) -> TracedPoint:
        """This structure traced at `batch`: assembled from the pass of the lender's trace at
        that batch where the two run the same pass and the lender has traced it."""
        if batch not in self.traced:
            lender = self.lender
            donor = (
                lender.traced.get(batch) if lender and same_pass(lender.spec, self.spec) else None
            )
            self.traced[batch] = TracedPoint(
                self.spec.at_batch(batch), self.found, donor, self.updates
            )
        return self.traced[batch]

    def fits(self, batch: int, log: StepLog) -> bool:
        """Whether `batch`, whose step is `log`, comes out `ok`: what the outcome of its result
        says (GPU budget, then host budget), without the search for its least limit."""

        allocator = self.spec.knobs.get("allocator", "default")
        if not gpu_fits(log, self.workspace, self.limit, allocator):
            return False
        host_budget = self.spec.host_memory_bytes
        return host_budget is None or (
            host_memory(log, self.spec.at_batch(batch)).peak_bytes <= host_budget
        )

    def run(self, start: int, lender: _Scan | None) -> ScanResult:
        """The answer over `lo`..`hi`, with the traces it needs from `start`: the top of the
        range first (when it fits, no batch above it is there to find, and without a window it
        is the answer); then a curve, lent by `lender` (a structure with the same forward and
        backward, which fits its own curve when first asked) where their steps agree, or fitted
        through three traces of its own. Traces that do not lie on one line are reported as
        they are, batch by batch."""
        self.lender = lender
        batches = curve_batches(start, self.hi)
        if len(batches) < 3:  # the range is too short for a curve: trace every batch
            fitting = [b for b in range(self.hi, self.lowest - 1, -1) if self._fits_traced(b)]
            best = max((b for b in fitting if b >= self.lo), default=None)
            window = self._window(
                max(fitting, default=None), self.lowest, self._traced_speed, fitting.__contains__
            )
            return self._reported(best, self._traced_result, window)
        top_fits = self._fits_traced(self.hi)
        if top_fits and (self.window is None or self._traced_speed(self.hi) < self.window.floor):
            # the answer, and no batch below it is as fast as the window's floor
            return self._reported(self.hi, self._traced_result, [])
        if self._curve(start, lender) is None:
            if top_fits:  # the answer, but not the window below it: the caller looks for it
                return self._reported(self.hi, self._traced_result, None)
            return self._not_affine(self.reason)
        return self.answer()

    def _curve(self, start: int, lender: _Scan | None) -> BatchCurve | None:
        """The structure's curve: the lender's growth where their steps agree, else its own;
        None when the traces do not lie on one line (`reason` says why)."""

        if lender is not None:
            lent = lender.own_curve(start)
            if lent is None:  # the same forward and backward do not lie on one line here either
                self.reason = f"{lender.reason} (the first structure of its group)"
                return None
            try:
                self.curve, self.shared = lent.shared_with(self.traced_at(self.hi).record), True
            except NotAffine as exc:
                log.info("%s: tracing %s itself", exc, self.spec.knobs)
        return self.curve or self.own_curve(start)

    def own_curve(self, start: int) -> BatchCurve | None:
        """This structure's curve through its traces at `curve_batches(start, hi)`, fitted the
        first time it is asked; None when they do not lie on one line (`reason` says why)."""

        if self.curve is None and not self.reason:
            batches = curve_batches(start, self.hi)
            try:
                self.curve = BatchCurve.fit([self.traced_at(b).record for b in batches])
            except NotAffine as exc:
                log.warning("%s: traced %s, answering batch by batch instead", exc, batches)
                self.reason = str(exc)
        return self.curve

    def _not_affine(self, reason: str) -> ScanResult:
        traced = [point.result() for point in self.traced.values()]
        return ScanResult(self.lo, self.hi, None, traced, sorted(self.traced), False, reason)

    def _fits_traced(self, batch: int) -> bool:
        return self.fits(batch, self.traced_at(batch).log)

    def _traced_result(self, batch: int) -> ProbeResult:
        return self.traced_at(batch).result()

    def _traced_speed(self, batch: int) -> float:
        """The samples/s of `batch`'s trace: its result's, without the rest of the result."""
        return self._speed(batch, self.traced_at(batch).cost.step_seconds)

    def _speed(self, batch: int, step_s: float) -> float:
        """The samples/s of `batch` in a step of `step_s`, as its result would say."""

        return samples_per_second({**self.spec.knobs, "batch_size": batch}, step_s) or 0.0

    def answer(self) -> ScanResult:
        """The largest batch that fits, from the curve, and the points reported."""

        curve, spec = self.curve, self.spec
        assert curve is not None
        # a batch's log and price, made once: whether it fits, its speed and its result read them
        log_at = functools.cache(curve.log_at)
        cost_at = functools.cache(lambda batch: curve.cost_at(batch, spec.gpu_spec))

        @functools.cache
        def fits(batch: int) -> bool:
            if batch in self.traced or batch < FIRST_CURVE_BATCH:
                return self.fits(batch, self.traced_at(batch).log)
            return self.fits(batch, log_at(batch))

        @functools.cache
        def result_at(batch: int) -> ProbeResult:
            if batch in self.traced or batch < FIRST_CURVE_BATCH:
                return self.traced_at(batch).result()
            point = spec.at_batch(batch)
            return replayed_point(curve, point, self.found, log_at(batch), cost_at(batch))

        @functools.cache
        def speed(batch: int) -> float:
            if batch in self.traced:
                return self._traced_speed(batch)
            return self._speed(batch, cost_at(batch).step_seconds)

        room = self.limit - sum(self.workspace)
        best = curve.largest_fitting(self.lo, self.hi, room, fits)
        first = max(self.lowest, FIRST_CURVE_BATCH)
        # a memory-saving structure may fit nothing above its parent, and still hold a run the
        # best rule prefers below it
        top = best if best is not None or first >= self.lo else (
            curve.largest_fitting(first, self.lo - 1, room, fits)
        )  # fmt: skip
        window = self._window(top, first, speed, fits)
        if window and min(window) == FIRST_CURVE_BATCH and self.lowest < FIRST_CURVE_BATCH:
            # Batch 1 is a program of its own, traced only where the window reaches batch 2
            assert self.window is not None and top is not None
            if fits(1) and speed(1) >= self.window.threshold(speed(top)):
                window.append(1)
        return self._reported(best, result_at, window)

    def _window(
        self,
        top: int | None,
        first: int,
        speed: Callable[[int], float],
        fits: Callable[[int], bool],
    ) -> list[int] | None:
        """The batches from `first` to `top` (the largest that fits) in the window (ScanWindow):
        each that fits at least as fast as the threshold, which the structure's fastest run,
        at `top`, sets. A roofline step's time per sample does not grow with the batch (each
        kernel's bytes and FLOPs are a constant part and one per sample), so no smaller batch
        runs faster, and those in the window are the batches from the least that is fast
        enough up. None: more than WINDOW_LIMIT of them, too many to report (the caller looks
        for the one the rule takes once it knows the floor)."""
        if self.window is None or top is None:
            return []
        threshold = self.window.threshold(speed(top))
        if speed(top) < threshold:
            return []
        low, high = first, top  # the least batch as fast as the threshold, by bisection
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if speed(middle) >= threshold else (middle + 1, high)
        if top - low + 1 > WINDOW_LIMIT:
            return None
        return [b for b in range(low, top + 1) if fits(b)]

    def _reported(
        self,
        best: int | None,
        result_at: Callable[[int], ProbeResult],
        window: list[int] | None,
    ) -> ScanResult:
        """The scan's answer with the points it reports: the best batch and the one above it,
        or `lo` when none fits; and the window's batches (None: too many to report, or not
        known), for the search's best rule (autofit/search/pareto.py BestRule)."""
        points = [self.lo] if best is None else [best] + ([best + 1] if best < self.hi else [])
        points += sorted(b for b in window or () if b not in points)
        results = [result_at(b) for b in points]
        floor = None if self.window is None or window is None else self.window.floor
        return ScanResult(self.lo, self.hi, best, results, [], window_floor=floor)


def scan(spec: ProbeSpec, lo: int, hi: int) -> ScanResult:
    """The scan of `spec`'s structure (its batch size is ignored) over `lo`..`hi`."""
    return scan_group([(spec, lo)], hi)[0]


def scan_group(
    items: list[tuple[ProbeSpec, int]],
    hi: int,
    window: ScanWindow | None = None,
    shared: SharedUpdates | None = None,
) -> list[ScanResult]:
    """Scans of structures that differ only in knobs that do not change what a sample adds (the
    optimizer, say), each over its `lo`..`hi`. Each is traced at `hi` first; one that needs a
    curve borrows the first structure's growth where their steps agree
    (BatchCurve.shared_with), the first tracing its curve's three batches once, on the first
    need; where they do not agree, it traces its own three. With a `window` (ScanWindow), each
    also reports the batches in it, from the window's least batch: the curves start there.
    `shared`: where the setup and updates of structures assembled from another's pass are kept
    for the search's other scans."""

    found = versions()
    scans: list[tuple[_Scan, ScanResult]] = []
    lender: _Scan | None = None
    ones = [_Scan(spec, lo, hi, found, window, shared) for spec, lo in items]
    start = max(min(one.lowest for one in ones), FIRST_CURVE_BATCH)
    for one in ones:
        spec, lo = one.spec, one.lo
        try:
            answer = one.run(start, lender)
        except Exception as exc:  # a crash is this structure's answer, as a probe's would be
            answer = _crashed(spec, lo, hi, exc)
        else:
            lender = lender or one
        scans.append((one, answer))
    for one, answer in scans:  # the lender's curve may have been traced after its answer
        answer.traced, answer.shared = sorted(one.traced), one.shared
    return [answer for _, answer in scans]


def _crashed(spec: ProbeSpec, lo: int, hi: int, exc: Exception) -> ScanResult:
    failed = ProbeResult.failed(
        spec.at_batch(lo), Outcome.CRASH, crash_message(exc),
        traceback.format_exc()[-4000:], "simulate",
    )  # fmt: skip
    return ScanResult(lo, hi, None, [failed], [], False, f"the scan crashed: {exc}")


def _result(result: ProbeResult, source: str, found: dict[str, str]) -> ProbeResult:
    result.source = source
    result.versions = found
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m autofit.fastpath.scan REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    request_path, result_path = (Path(a) for a in args)
    request = json.loads(request_path.read_text())
    items = [(ProbeSpec(**item["spec"]), item["lo"]) for item in request["structures"]]
    hi = request["hi"]
    leave_out_unused(spec for spec, _ in items)
    try:
        root = request.get("updates_dir")
        shared = SharedUpdates(Path(root) if root else None)
        window = request.get("window")
        answers = scan_group(items, hi, ScanWindow(**window) if window else None, shared)
    except Exception as exc:  # before any structure's scan began: each has crashed
        answers = [_crashed(spec, lo, hi, exc) for spec, lo in items]
    write_atomically(result_path, json.dumps([answer.to_dict() for answer in answers]))
    return 0


if __name__ == "__main__":
    exit_now(main())  # as a probe's worker does: no teardown of torch's objects
