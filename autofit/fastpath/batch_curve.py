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
from typing import Any, NamedTuple

import numpy as np

from autofit.gpus import GpuSpec
from autofit.run_state import Exchange
from autofit.simulator.allocator_replay import replay
from autofit.simulator.roofline import (
    Kernel,
    RooflineCounter,
    StepCost,
    Traffic,
    device_clock,
    kernel_arrays,
    memory_bandwidth,
    price_arrays,
)
from autofit.simulator.step_log import StepLog

_TRAFFIC = ("link_bytes", "host_compute_bytes", "peer_bytes", "nvme_bytes", "nvme_step_bytes")


class NotAffine(Exception):
    """Traces of one structure at different batches do not lie on one line; the message says
    what differed."""


class Structure(NamedTuple):
    """What must be the same at every batch of one structure's traces."""

    categories: tuple[int, ...]  # allocation id -> index into CATEGORIES
    streams: tuple[int, ...]  # allocation id -> the CUDA stream it is made on
    events: tuple[int, ...]  # runs of frees in one order (canonical_frees)
    phase_changes: tuple[tuple[int, str], ...]
    host_pinned: tuple[bool, ...]
    host_events: tuple[int, ...]
    host_event_phases: tuple[str, ...]
    ops: int  # dispatched ops of the priced step
    exchanges: tuple[tuple[int, int], ...]  # block swap: (ready, needed) as kernel positions
    kernel_at: tuple[int, ...]  # each kernel's place among the allocations


# How a message names each part of a Structure.
_SAID = {
    "categories": "allocation categories",
    "streams": "allocation streams",
    "events": "allocation events",
    "phase_changes": "phases",
    "host_pinned": "host allocations (pinned or not)",
    "host_events": "host events",
    "host_event_phases": "host event phases",
    "ops": "dispatched ops",
    "exchanges": "block swap exchanges",
    "kernel_at": "kernels' places among the allocations",
}


@dataclass(frozen=True)
class StepRecord:
    """What a traced run at `batch` holds for the answer: `structure` must be the same at every
    batch, `numbers` (int64, in `parts` order) affine in the batch."""

    batch: int
    structure: Structure
    numbers: np.ndarray
    parts: tuple[tuple[str, int], ...]  # (name, length) of each run of `numbers`
    rates: tuple[float, ...]  # each kernel's math rate (part of the structure too)
    param_count: int
    trainable_param_count: int


def _clock(kernels: Sequence[Kernel], bandwidth: float) -> list[float]:
    """The roofline's device clock before each kernel and after the last, summed as it sums."""
    return device_clock(*kernel_arrays(kernels), bandwidth).tolist()


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
    clock = _clock(kernels, memory_bandwidth(roofline.gpu))
    exchanges = tuple(
        (_position(clock, e.ready_at), _position(clock, e.needed_at)) for e in traffic.exchanges
    )
    structure = Structure(
        categories=tuple(log.categories),
        streams=tuple(log.streams),
        events=canonical_frees(log.events),
        phase_changes=tuple(log.phase_changes),
        host_pinned=tuple(log.host_pinned),
        host_events=canonical_frees(log.host_events, log.host_event_phases),
        host_event_phases=tuple(log.host_event_phases),
        ops=roofline.cost.ops,
        exchanges=exchanges,
        kernel_at=tuple(k.at for k in kernels),
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

    def shared_with(self, member: StepRecord) -> BatchCurve:
        """The curve of another structure that runs the same forward and backward (it differs
        in the optimizer, say), from one record of it at any batch this curve answers.

        Where this curve grows with the batch, the member must do exactly what this structure
        does at that batch: each phase in which an allocation grows (a forward, a backward) the
        same allocations and frees in the same order, sizes and categories; the kernels that
        grow the same kernels; the same traffic if it grows. The member's figures there then
        grow as this curve's do. Everywhere else this curve does not grow, and neither does the
        member: an optimizer sees weights and gradients, never the batch. NotAffine says where
        the member differs."""
        mine, theirs = self._first, member
        own, other = self._numbers(theirs.batch), _split(theirs.numbers, theirs.parts)
        slopes = self._parts(self._slope)
        shared: dict[str, np.ndarray] = {
            name: np.zeros(length, dtype=np.int64) for name, length in theirs.parts
        }
        # allocations, phase by phase
        mine_s, theirs_s = mine.structure, theirs.structure
        gpu = _aligned(
            (mine_s.events, theirs_s.events),
            (_labels(mine_s.events, mine_s.phase_changes),
             _labels(theirs_s.events, theirs_s.phase_changes)),
            (own["raw_sizes"], other["raw_sizes"]),
            (tuple(zip(mine_s.categories, mine_s.streams, strict=True)),
             tuple(zip(theirs_s.categories, theirs_s.streams, strict=True))),
            slopes["raw_sizes"],
        )  # fmt: skip
        host = _aligned(
            (mine_s.host_events, theirs_s.host_events),
            (mine_s.host_event_phases, theirs_s.host_event_phases),
            (own["host_raw_sizes"], other["host_raw_sizes"]),
            (mine_s.host_pinned, theirs_s.host_pinned),
            slopes["host_raw_sizes"],
        )
        for kind, mapping in (("raw_sizes", gpu), ("host_raw_sizes", host)):
            for theirs_id, mine_id in mapping.items():
                shared[kind][theirs_id] = slopes[kind][mine_id]
        # kernels: the growing ones come first (forward, backward), the optimizer's last
        growing = np.flatnonzero((slopes["kernel_bytes"] != 0) | (slopes["kernel_flops"] != 0))
        if growing.size:
            reach = int(growing[-1]) + 1
            same = (
                len(theirs.rates) >= reach
                and theirs.rates[:reach] == mine.rates[:reach]
                and np.array_equal(other["kernel_bytes"][:reach], own["kernel_bytes"][:reach])
                and np.array_equal(other["kernel_flops"][:reach], own["kernel_flops"][:reach])
            )
            if not same:
                raise NotAffine("the member's kernels differ where the kernels grow")
            for kind in ("kernel_bytes", "kernel_flops"):
                shared[kind][:reach] = slopes[kind][:reach]
        for kind in ("traffic", "exchange_bytes"):
            if np.any(slopes[kind]):
                if (
                    not np.array_equal(other[kind], own[kind])
                    or mine.structure.exchanges != theirs.structure.exchanges
                ):
                    raise NotAffine(f"the member's {kind.replace('_', ' ')} differ where they grow")
                shared[kind] = slopes[kind].copy()
        slope = np.concatenate([shared[name] for name, _ in theirs.parts])
        return BatchCurve(theirs, slope, (theirs.batch,))

    def _parts(self, values: np.ndarray) -> dict[str, np.ndarray]:
        return _split(values, self._first.parts)

    # -- the step at a batch -------------------------------------------------------------------

    def _numbers(self, batch: int) -> dict[str, np.ndarray]:
        return self._parts(self._first.numbers + self._slope * (batch - self._first.batch))

    def log_at(self, batch: int) -> StepLog:
        """The allocation log a trace at `batch` would have recorded."""
        numbers = self._numbers(batch)
        sizes = numbers["raw_sizes"]
        if np.any(sizes <= 0) or np.any(numbers["host_raw_sizes"] <= 0):
            raise NotAffine(f"an allocation's size reaches zero at batch {batch}")
        kept = self._first.structure
        return StepLog.counted(
            sizes.tolist(), kept.categories, kept.events, kept.phase_changes,
            numbers["host_raw_sizes"].tolist(), kept.host_pinned, kept.host_events,
            kept.host_event_phases, kept.streams,
        )  # fmt: skip

    def cost_at(self, batch: int, gpu: GpuSpec) -> StepCost:
        """The priced step a trace at `batch` would have counted on `gpu`."""
        numbers = self._numbers(batch)
        nbytes, flops = numbers["kernel_bytes"], numbers["kernel_flops"]
        rates = np.asarray(self._first.rates, dtype=np.float64)
        traffic = dict(zip(_TRAFFIC, (int(v) for v in numbers["traffic"]), strict=True))
        ops, positions = self._first.structure.ops, self._first.structure.exchanges
        clock = device_clock(nbytes, flops, rates, memory_bandwidth(gpu))
        exchanges = tuple(
            Exchange(float(clock[ready]), float(clock[needed]), int(link))
            for (ready, needed), link in zip(positions, numbers["exchange_bytes"], strict=True)  # type: ignore[call-overload]
        )
        moved = Traffic(**traffic, exchanges=exchanges)  # type: ignore[arg-type]
        return price_arrays(gpu, nbytes, flops, rates, ops, moved, clock)

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
        ids = np.asarray(self._first.structure.events, dtype=np.int64)
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
    allocator_replay.required_memory decides (the plentiful replay within the limit, or a replay
    under the limit that does not run out), without the search for the least limit."""
    if log.peak + sum(persistent) > limit:
        return False
    plentiful = replay(
        log.events, log.sizes, persistent, allocator=allocator, streams=log.streams
    ).peak_reserved_bytes
    log.plentiful_reserved[tuple(persistent), allocator] = plentiful
    if plentiful <= limit:
        return True
    return (
        replay(log.events, log.sizes, persistent, limit, allocator, log.streams).oom_event is None
    )


def _split(values: np.ndarray, parts: tuple[tuple[str, int], ...]) -> dict[str, np.ndarray]:
    """`values` cut into a record's parts, by name."""
    found, start = {}, 0
    for name, length in parts:
        found[name] = values[start : start + length]
        start += length
    return found


def _labels(events: Sequence[int], phase_changes: Sequence[tuple[int, str]]) -> list[str]:
    """The phase of each event, from the log's phase changes (first event index, phase)."""
    labels, phase, next_change = [], "setup", 0
    for index in range(len(events)):
        while next_change < len(phase_changes) and phase_changes[next_change][0] <= index:
            phase = phase_changes[next_change][1]
            next_change += 1
        labels.append(phase)
    return labels


def _runs(labels: Sequence[str]) -> list[tuple[str, int, int]]:
    """The runs of events of one phase: (phase, start, end)."""
    runs: list[tuple[str, int, int]] = []
    for index, label in enumerate(labels):
        if runs and runs[-1][0] == label:
            runs[-1] = (label, runs[-1][1], index + 1)
        else:
            runs.append((label, index, index + 1))
    return runs


Pair = tuple[Sequence[Any], Sequence[Any]]  # (mine, theirs)


def _aligned(
    events: Pair, labels: Pair, sizes: Pair, tags: Pair, slopes: np.ndarray
) -> dict[int, int]:
    """Their allocation ids mapped to mine, in every run of one phase where one of mine grows
    with the batch; NotAffine where such a run differs (order, sizes, or `tags`: categories, or
    pinned or not)."""
    if not np.any(slopes):
        return {}  # nothing of this kind grows: the member's stays as traced
    my_runs, their_runs = _runs(labels[0]), _runs(labels[1])
    if [r[0] for r in my_runs] != [r[0] for r in their_runs]:
        raise NotAffine("the member's phases differ")
    mapping: dict[int, int] = {}
    for (phase, a, b), (_, c, d) in zip(my_runs, their_runs, strict=True):
        mine_run, theirs_run = events[0][a:b], events[1][c:d]
        if not any(e >= 0 and slopes[e] for e in mine_run):
            continue
        same = len(mine_run) == len(theirs_run) and all(
            (m >= 0) == (t >= 0)
            and (m < 0 or (sizes[0][m] == sizes[1][t] and tags[0][m] == tags[1][t]))
            for m, t in zip(mine_run, theirs_run, strict=True)
        )
        if not same:
            raise NotAffine(f"the member's {phase} differs in its allocations")
        mapping.update((t, m) for m, t in zip(mine_run, theirs_run, strict=True) if m >= 0)
    return mapping


def _same_structure(first: StepRecord, other: StepRecord) -> None:
    for field, mine, theirs in zip(
        Structure._fields, first.structure, other.structure, strict=True
    ):
        if mine != theirs:
            raise NotAffine(
                f"the {_SAID[field]} differ between batches {first.batch} and {other.batch}"
            )
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
