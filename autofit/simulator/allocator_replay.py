"""Replaying a tracker's event log through a model of the CUDA caching allocator
(autofit/simulator/allocator.py), for the reserved peak and where a limit runs it out of memory.

A run can fit in less memory than it reserves where memory is plentiful: `required_memory`
finds both figures, and the smallest limit under which the run does not run out, going on from
a copy of the plentiful replay where the limit first matters rather than replaying each limit
from the start.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from autofit.simulator.allocator import (
    LARGE_ROUNDING,
    MODELS,
    AllocatorModel,
    AllocatorOutOfMemory,
    Block,
)


@dataclass(frozen=True)
class AllocatorReplay:
    """What the replay saw: its reserved peak, and the event that ran out of memory, if one did."""

    peak_reserved_bytes: int
    peak_event: int  # index of the event at which the reserved peak was reached (-1: before any)
    segments: int
    oom_event: int | None = None  # -1: the persistent allocations alone did not fit


@dataclass(frozen=True)
class Requirement:
    """A run's memory on a GPU with the allocator limited to `limit` bytes."""

    reserved_when_plentiful: int  # what the allocator reserves with no limit in sight
    required: int  # the smallest limit (to 2 MiB) under which the run does not run out
    fits: bool  # whether it runs under `limit`
    oom_event: int | None  # where it runs out under `limit`, if it does


def replay(
    events: Sequence[int],
    sizes: Sequence[int],
    persistent: Iterable[int] = (),
    limit: int | None = None,
    allocator: str = "default",
    streams: Sequence[int] | None = None,
) -> AllocatorReplay:
    """Replay a tracker's event log (id = allocated, ~id = freed) through the allocator model
    for the `allocator` setting (a key of `MODELS`). `streams[id]`: the CUDA stream allocation
    `id` was made on (None: all on the default stream), whose pool serves it.

    `persistent` allocations are made first and never freed (the cuBLAS workspace, for one).
    With a `limit`, the replay stops at the first request that does not fit under it.
    """
    started = _Progress.start(allocator, limit, persistent)
    if isinstance(started, AllocatorReplay):
        return started
    return started.run(events, sizes, streams=streams)[0]


class _Progress:
    """A replay part-way through an event log: the model, the blocks it holds by allocation id,
    its reserved peak so far and where, and the next event. `resumed` makes a copy to go on from
    under another limit: `required_memory` replays the common start of its replays once."""

    def __init__(self, model: AllocatorModel, held: dict[int, Block], peak: int, at: int) -> None:
        self.model, self.held, self.peak, self.peak_event = model, held, peak, at
        self.index = 0

    @staticmethod
    def start(
        allocator: str, limit: int | None, persistent: Iterable[int]
    ) -> _Progress | AllocatorReplay:
        """The model after the persistent allocations; their AllocatorReplay if they do not
        fit."""
        model = MODELS[allocator](limit)
        try:
            for size in persistent:
                model.malloc(size)
        except AllocatorOutOfMemory:
            return AllocatorReplay(model.reserved, -1, model.segments, oom_event=-1)
        return _Progress(model, {}, model.reserved, -1)

    def run(
        self,
        events: Sequence[int],
        sizes: Sequence[int],
        watch: int | None = None,
        streams: Sequence[int] | None = None,
    ) -> tuple[AllocatorReplay, _Progress | None]:
        """Replays the rest of the log. With `watch`, also a copy of the progress just before
        the first event after which more than `watch` bytes are reserved (None: no event is):
        until that event, a replay limited to `watch` or more does just what this one does."""
        model, held = self.model, self.held
        peak, peak_event = self.peak, self.peak_event
        before_crossing: _Progress | None = None
        candidate: _Progress | None = None
        if watch is not None and model.reserved > watch:
            watch = None  # over it before the first event: a limited replay differs from the start
        for index in range(self.index, len(events)):
            event = events[index]
            if event >= 0:
                size = sizes[event]
                stream = streams[event] if streams is not None else 0
                if watch is not None and model.reserved + model.most_growth(size, stream) > watch:
                    candidate = self._copied(index, peak, peak_event)
                try:
                    held[event] = model.malloc(size, stream)
                except AllocatorOutOfMemory:
                    return AllocatorReplay(peak, peak_event, model.segments, index), None
                if model.reserved > peak:
                    peak, peak_event = model.reserved, index
                if watch is not None and model.reserved > watch:
                    # the copy made before this very event, if any (else none to go on from)
                    if candidate is not None and candidate.index == index:
                        before_crossing = candidate
                    watch = None
            else:
                block = held.pop(~event, None)
                if block is not None:
                    model.free(block)
        return AllocatorReplay(peak, peak_event, model.segments), before_crossing

    def _copied(self, index: int, peak: int, peak_event: int) -> _Progress:
        """This progress as it stands before event `index`, its blocks cloned."""
        found: dict[int, Block] = {}
        stack = [*self.held.values(), *self.model.blocks()]
        while stack:  # every block of every segment: each hangs off a held, free or unmapped one
            block = stack.pop()
            if id(block) not in found:
                found[id(block)] = block
                stack.extend(b for b in (block.prev, block.next) if b is not None)
        twin: dict[int, Block] = {}
        for key, block in found.items():
            clone = twin[key] = Block.__new__(Block)
            clone.address, clone.size, clone.small = block.address, block.size, block.small
            clone.stream = block.stream
            clone.free, clone.mapped = block.free, block.mapped
        for key, block in found.items():
            clone = twin[key]
            clone.prev = None if block.prev is None else twin[id(block.prev)]
            clone.next = None if block.next is None else twin[id(block.next)]
        held = {event: twin[id(block)] for event, block in self.held.items()}
        copy = _Progress(self.model.cloned(twin), held, peak, peak_event)
        copy.index = index
        return copy

    def resumed(self, limit: int) -> _Progress:
        """A copy to go on from under `limit` (no less than the `watch` it was taken for)."""
        copy = self._copied(self.index, self.peak, self.peak_event)
        copy.model.limit = limit
        return copy


def required_memory(
    events: Sequence[int],
    sizes: Sequence[int],
    persistent: Sequence[int],
    limit: int,
    allocator: str = "default",
    plentiful_reserved: int | None = None,
    streams: Sequence[int] | None = None,
) -> Requirement:
    """How the run fares with the allocator (setting `allocator`) limited to `limit`, and the
    least it needs. `plentiful_reserved`: what a replay without a limit reserved at most, where
    the caller has replayed it (within `limit`, the answer needs no replay).

    Every replay under a limit of `limit` or more does what the plentiful one does up to the
    first event after which that one reserves more than `limit`: those replays go on from a
    copy of the plentiful one there. For a batch just over the budget (the one above the
    largest that fits, which every scan reports) that event comes late, 56% to 68% into Sana
    1600M's steps, and the answer two to three times sooner (benchmarks/required_memory.py);
    far over the budget, about as soon as from the start."""
    if plentiful_reserved is not None and plentiful_reserved <= limit:
        return Requirement(plentiful_reserved, plentiful_reserved, True, None)
    started = _Progress.start(allocator, None, persistent)
    assert isinstance(started, _Progress), "nothing runs out of memory without a limit"
    plentiful, crossing = started.run(events, sizes, watch=limit, streams=streams)
    if plentiful.peak_reserved_bytes <= limit:
        return Requirement(plentiful.peak_reserved_bytes, plentiful.peak_reserved_bytes, True, None)

    def under(cap: int) -> AllocatorReplay:
        if crossing is None or cap < limit:
            return replay(events, sizes, persistent, cap, allocator, streams)
        return crossing.resumed(cap).run(events, sizes, streams=streams)[0]

    capped = under(limit)
    fits = capped.oom_event is None
    # The least limit that works: between what is known to fail and what is known to work.
    works, fails = (limit, 0) if fits else (plentiful.peak_reserved_bytes, limit)
    while works - fails > LARGE_ROUNDING:
        middle = (works + fails) // 2
        if under(middle).oom_event is None:
            works = middle
        else:
            fails = middle
    return Requirement(plentiful.peak_reserved_bytes, works, fits, capped.oom_event)
