"""Every batch size of one structure from three traces: record, check, replay.

A simulated step of a model with no data-dependent control flow is the same program at every
batch size: the same allocations and frees in the same order, the same kernels, only sizes
change, and those are affine in the batch (weights, gradients and optimizer state constant,
activations and their temporaries a fixed number of bytes per sample). So the step's allocation
log, its host ledger and its priced kernels, traced at three batches, give every other batch:

- `record` keeps of a traced run what the answer reads: the event order, categories, phases and
  host events (the *structure*, which must be identical at every traced batch), and every size,
  kernel byte and FLOP count and traffic figure (the *numbers*, which must lie on one line in
  the batch: whole bytes per sample);
- `BatchCurve.fit` checks both over three traces (two fix the line, the third must lie on it)
  and raises `NotAffine`, saying what differed, when they do not: the caller then traces each
  batch it needs instead;
- `BatchCurve.log_at` / `cost_at` give the StepLog and StepCost the step has at any batch: the
  sizes the line gives, rounded as the allocator rounds them, with the tracker's peak counted
  over the same events and the roofline's sums taken in the same order; the simulate backend's
  own `measurement` turns them into the figures a direct trace reports, to the byte;
- `BatchCurve.largest_fitting` finds the largest batch that fits without replaying the
  allocator at every batch: a batch whose requested bytes alone exceed the limit at some event
  cannot fit (the allocator's rounding and cache only add), which bounds the answer from above,
  and the batches below the bound are checked downwards until one fits, so a curve that is not
  monotonic (fits at 50 and 54, not at 51 to 53) still gives the largest.

The three traced batches are the range's two smallest and its largest: a size that changes
nonlinearly (padding to a multiple, a branch on the batch) shows at the far end if anywhere.
Block swap's exchanges are read on the roofline's clock, which is a sum over the kernels before
them; they are kept as kernel positions and priced again on the replayed clock.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from autofit.gpus import GpuSpec
from autofit.run_state import Exchange
from autofit.simulator.allocator import replay
from autofit.simulator.roofline import (
    Kernel,
    RooflineCounter,
    StepCost,
    Traffic,
    _kernel_seconds,
    price,
)
from autofit.simulator.step_log import StepLog

_TRAFFIC = ("link_bytes", "host_compute_bytes", "peer_bytes", "nvme_bytes", "nvme_step_bytes")


class NotAffine(Exception):
    """Traces of one structure at different batches do not lie on one line; the message says
    what differed."""


@dataclass(frozen=True)
class StepRecord:
    """What a traced run at `batch` holds for the answer: `structure` must be the same at every
    batch, `numbers` (int64, in `parts` order) affine in the batch."""

    batch: int
    structure: tuple[object, ...]
    numbers: np.ndarray
    parts: tuple[tuple[str, int], ...]  # (name, length) of each run of `numbers`
    rates: tuple[float, ...]  # each kernel's math rate (part of the structure too)
    param_count: int
    trainable_param_count: int


def _clock(kernels: Sequence[Kernel], bandwidth: float) -> list[float]:
    """The roofline's device clock before each kernel and after the last, summed as it sums."""
    clock, now = [0.0], 0.0
    for kernel in kernels:
        now += _kernel_seconds(kernel.nbytes, kernel.flops, kernel.rate, bandwidth)
        clock.append(now)
    return clock


def _position(clock: list[float], reading: float) -> int:
    """How many kernels had run when the clock read `reading`."""
    index = bisect.bisect_left(clock, reading)
    if index == len(clock) or clock[index] != reading:
        raise NotAffine("a block swap exchange was timed between kernels")
    return index


def record(
    batch: int, log: StepLog, roofline: RooflineCounter, param_count: int, trainable: int
) -> StepRecord:
    """The record of a run traced at `batch` by a tracker (`log`) and a roofline that kept its
    kernels and traffic (RooflineCounter(keep_kernels=True))."""
    kernels, traffic = roofline.kernels, roofline.traffic
    assert kernels is not None and traffic is not None, "the roofline must keep its kernels"
    clock = _clock(kernels, roofline._bandwidth)
    exchanges = tuple(
        (_position(clock, e.ready_at), _position(clock, e.needed_at)) for e in traffic.exchanges
    )
    structure = (
        tuple(log.categories),
        canonical_frees(log.events),
        tuple(log.phase_changes),
        tuple(log.host_pinned),
        canonical_frees(log.host_events, log.host_event_phases),
        tuple(log.host_event_phases),
        roofline.cost.ops,
        exchanges,
    )
    runs = {
        "raw_sizes": log.raw_sizes,
        "host_raw_sizes": log.host_raw_sizes,
        "kernel_bytes": [k.nbytes for k in kernels],
        "kernel_flops": [k.flops for k in kernels],
        "traffic": [getattr(traffic, name) for name in _TRAFFIC],
        "exchange_bytes": [e.link_bytes for e in traffic.exchanges],
    }
    parts = tuple((name, len(values)) for name, values in runs.items())
    numbers = np.array([v for values in runs.values() for v in values], dtype=np.int64)
    rates = tuple(k.rate for k in kernels)
    return StepRecord(batch, structure, numbers, parts, rates, param_count, trainable)


def canonical_frees(events: Sequence[int], phases: Sequence[str] | None = None) -> tuple[int, ...]:
    """`events` with each run of frees (with no allocation between them, and in one phase when
    `phases` are given) in one order: ids descending.

    Storages that die together (a graph's saved tensors, a dict of them) are freed in an order
    that can change from one trace to the next, and it changes nothing this log is read for: a
    free never raises the allocated total, and the allocator model ends a run of frees with the
    same free blocks, merged alike, whatever their order (it hands out memory only on a
    malloc). So runs are compared, and replayed, in one order."""
    found: list[int] = []
    run: list[int] = []
    for index, event in enumerate(events):
        if run and (event >= 0 or (phases is not None and phases[index] != phases[index - 1])):
            found.extend(sorted(run))
            run = []
        if event >= 0:
            found.append(event)
        else:
            run.append(event)
    found.extend(sorted(run))
    return tuple(found)


_STRUCTURE_NAMES = (
    "allocation categories",
    "allocation events",
    "phases",
    "host allocations (pinned or not)",
    "host events",
    "host event phases",
    "dispatched ops",
    "block swap exchanges",
)


class BatchCurve:
    """A structure's step at any batch, from records at three batches (`fit`)."""

    def __init__(self, first: StepRecord, slope: np.ndarray, traced: tuple[int, ...]) -> None:
        self._first, self._slope, self.traced = first, slope, traced

    @classmethod
    def fit(cls, records: Sequence[StepRecord]) -> BatchCurve:
        """Check that the records (three, at different batches) agree on the structure and that
        every number lies on one line in the batch, with whole bytes per sample."""
        first, second, *rest = sorted(records, key=lambda r: r.batch)
        traced = tuple(r.batch for r in (first, second, *rest))
        for other in (second, *rest):
            _same_structure(first, other)
        step = second.batch - first.batch
        rise = second.numbers - first.numbers
        if np.any(rise % step):
            raise NotAffine(
                f"{_where(first, np.flatnonzero(rise % step))} grow by a fraction of a byte per "
                f"sample between batches {first.batch} and {second.batch}"
            )
        slope = rise // step
        for other in rest:
            off = np.flatnonzero(
                first.numbers + slope * (other.batch - first.batch) - other.numbers
            )
            if off.size:
                raise NotAffine(
                    f"{_where(first, off)} at batch {other.batch} are not on the line through "
                    f"batches {first.batch} and {second.batch}"
                )
        return cls(first, slope, traced)

    # -- the step at a batch -------------------------------------------------------------------

    def _numbers(self, batch: int) -> dict[str, np.ndarray]:
        values = self._first.numbers + self._slope * (batch - self._first.batch)
        found, start = {}, 0
        for name, length in self._first.parts:
            found[name] = values[start : start + length]
            start += length
        return found

    def log_at(self, batch: int) -> StepLog:
        """The allocation log a trace at `batch` would have recorded."""
        numbers = self._numbers(batch)
        sizes = numbers["raw_sizes"]
        if np.any(sizes <= 0) or np.any(numbers["host_raw_sizes"] <= 0):
            raise NotAffine(f"an allocation's size reaches zero at batch {batch}")
        categories, events, phases, pinned, host_events, host_phases, *_ = self._first.structure
        return StepLog.counted(
            sizes.tolist(), categories, events, phases,  # type: ignore[arg-type]
            numbers["host_raw_sizes"].tolist(), pinned, host_events, host_phases,  # type: ignore[arg-type]
        )  # fmt: skip

    def cost_at(self, batch: int, gpu: GpuSpec) -> StepCost:
        """The priced step a trace at `batch` would have counted on `gpu`."""
        numbers = self._numbers(batch)
        kernels = [
            Kernel(int(b), int(f), rate)
            for b, f, rate in zip(
                numbers["kernel_bytes"], numbers["kernel_flops"], self._first.rates, strict=True
            )
        ]
        traffic = dict(zip(_TRAFFIC, (int(v) for v in numbers["traffic"]), strict=True))
        ops, positions = self._first.structure[6], self._first.structure[7]
        clock = _clock(kernels, RooflineCounter(gpu)._bandwidth)
        exchanges = tuple(
            Exchange(clock[ready], clock[needed], int(link))
            for (ready, needed), link in zip(positions, numbers["exchange_bytes"], strict=True)  # type: ignore[call-overload]
        )
        return price(gpu, kernels, ops, Traffic(**traffic, exchanges=exchanges))  # type: ignore[arg-type]

    @property
    def param_count(self) -> int:
        return self._first.param_count

    @property
    def trainable_param_count(self) -> int:
        return self._first.trainable_param_count

    # -- the largest batch that fits -----------------------------------------------------------

    def requested_bound(self, limit: int, lo: int, hi: int) -> int:
        """The largest batch in [lo - 1, hi] whose requested bytes stay within `limit` at every
        event (lo - 1: none): no larger batch can fit under `limit`."""
        categories, events, *_ = self._first.structure
        ids = np.asarray(events, dtype=np.int64)
        allocated = ids >= 0
        which = np.where(allocated, ids, ~ids)
        sign = np.where(allocated, 1, -1)
        sizes = self._numbers(self._first.batch)["raw_sizes"]
        base = np.cumsum(sign * (sizes - self._slope[: len(sizes)] * self._first.batch)[which])
        per_sample = np.cumsum(sign * self._slope[: len(sizes)][which])
        # current(b) = base + per_sample * b at each event; where per_sample > 0 it passes the
        # limit above (limit - base) / per_sample
        growing = per_sample > 0
        bound = hi
        if np.any(growing):
            bound = min(bound, int(np.min((limit - base[growing]) // per_sample[growing])))
        while bound >= lo and np.max(base + per_sample * bound, initial=0) > limit:
            bound -= 1  # an event whose bytes do not grow with the batch is over the limit
        return max(bound, lo - 1)

    def largest_fitting(
        self, lo: int, hi: int, limit: int, fits: Callable[[int], bool]
    ) -> int | None:
        """The largest batch in [lo, hi] for which `fits` holds, asking it only below the bound
        of requested bytes under `limit` (the allocator's limit), from the top down."""
        for batch in range(self.requested_bound(limit, lo, hi), lo - 1, -1):
            if fits(batch):
                return batch
        return None


def gpu_fits(log: StepLog, persistent: Sequence[int], limit: int, allocator: str) -> bool:
    """Whether the run's allocations fit the allocator under `limit`: what
    allocator.required_memory decides (the plentiful replay within the limit, or a replay under
    the limit that does not run out), without the search for the least limit."""
    if log.peak + sum(persistent) > limit:
        return False
    if replay(log.events, log.sizes, persistent, allocator=allocator).peak_reserved_bytes <= limit:
        return True
    return replay(log.events, log.sizes, persistent, limit, allocator).oom_event is None


def _same_structure(first: StepRecord, other: StepRecord) -> None:
    for name, mine, theirs in zip(_STRUCTURE_NAMES, first.structure, other.structure, strict=True):
        if mine != theirs:
            raise NotAffine(f"the {name} differ between batches {first.batch} and {other.batch}")
    if first.parts != other.parts:
        raise NotAffine(f"the kernels differ between batches {first.batch} and {other.batch}")
    if first.rates != other.rates:
        raise NotAffine(
            f"the kernels' math rates differ between batches {first.batch} and {other.batch}"
        )


def _where(record: StepRecord, indices: np.ndarray) -> str:
    """Which parts of a record the numbers at `indices` belong to, for a message."""
    names, start = [], 0
    for name, length in record.parts:
        count = int(np.count_nonzero((indices >= start) & (indices < start + length)))
        if count:
            names.append(f"{count} {name.replace('_', ' ')}")
        start += length
    return ", ".join(names)
