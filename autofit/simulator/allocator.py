"""A model of PyTorch's CUDA caching allocator, to turn allocated bytes into reserved bytes.

A GPU holds more than the live tensors: the caching allocator carves blocks out of segments it
obtained with cudaMalloc and keeps freed blocks cached, so the memory reserved from the driver
peaks above the allocated peak. Replaying the tracker's event log through the same rules gives the
reserved peak. The rules follow c10/cuda/CUDACachingAllocator.cpp with default settings
(no `expandable_segments`, no `max_split_size_mb`, one stream):

- requests are rounded up to 512 bytes (the tracker already did);
- requests up to 1 MiB come from the small pool, carved from 2 MiB segments;
- larger requests come from the large pool; a new segment is 20 MiB for requests under 10 MiB,
  else the request rounded up to 2 MiB;
- a request takes the smallest cached block that is large enough (best fit, lowest address on a
  tie) and splits off the rest when the rest is at least 512 bytes (small pool) or over 1 MiB
  (large pool);
- a freed block merges with free neighbours of the same segment and returns to its pool;
- segments are kept until a cudaMalloc would exceed the memory limit: then every segment that is
  wholly free is given back and the cudaMalloc retried, and only if it still does not fit is the
  request out of memory.

So a run can fit in less memory than it reserves where memory is plentiful: `required_memory`
finds both figures, and the smallest limit under which the run does not run out.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MIB = 1 << 20
SMALL_REQUEST = 1 * MIB  # largest request served from the small pool
SMALL_SEGMENT = 2 * MIB
LARGE_SEGMENT = 20 * MIB  # segment for requests between 1 MiB and MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MIB
LARGE_ROUNDING = 2 * MIB
MIN_SPLIT_REMAINDER_SMALL = 512


def segment_size(request: int) -> int:
    """Bytes cudaMalloc'ed for a new segment that must hold `request` bytes."""
    if request <= SMALL_REQUEST:
        return SMALL_SEGMENT
    if request < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-request // LARGE_ROUNDING) * LARGE_ROUNDING


class _Block:
    __slots__ = ("address", "size", "small", "free", "prev", "next")

    def __init__(self, address: int, size: int, small: bool) -> None:
        self.address = address
        self.size = size
        self.small = small
        self.free = True
        self.prev: _Block | None = None
        self.next: _Block | None = None


class _Pool:
    """Free blocks ordered by (size, address), for best-fit lookup."""

    def __init__(self) -> None:
        self._keys: list[tuple[int, int]] = []
        self._blocks: dict[int, _Block] = {}

    def add(self, block: _Block) -> None:
        bisect.insort(self._keys, (block.size, block.address))
        self._blocks[block.address] = block

    def remove(self, block: _Block) -> None:
        index = bisect.bisect_left(self._keys, (block.size, block.address))
        del self._keys[index]
        del self._blocks[block.address]

    def whole_segments(self) -> list[_Block]:
        return [b for b in self._blocks.values() if b.prev is None and b.next is None]

    def best_fit(self, size: int) -> _Block | None:
        index = bisect.bisect_left(self._keys, (size, -1))
        if index == len(self._keys):
            return None
        block = self._blocks[self._keys[index][1]]
        self.remove(block)
        return block


class AllocatorOutOfMemory(Exception):
    """A segment did not fit under the limit even after the cache was given back."""


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


class CachingAllocatorModel:
    def __init__(self, limit: int | None = None) -> None:
        self._pools = {True: _Pool(), False: _Pool()}
        self._next_address = 0
        self.limit = limit
        self.reserved = 0
        self.segments = 0

    def malloc(self, size: int) -> _Block:
        small = size <= SMALL_REQUEST
        pool = self._pools[small]
        block = pool.best_fit(size)
        if block is None:
            block = self._new_segment(segment_size(size), small)
        remainder = block.size - size
        if small:
            split = remainder >= MIN_SPLIT_REMAINDER_SMALL
        else:
            split = remainder > SMALL_REQUEST
        if split:
            rest = _Block(block.address + size, remainder, small)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            pool.add(rest)
        block.free = False
        return block

    def free(self, block: _Block) -> None:
        pool = self._pools[block.small]
        block.free = True
        prev, nxt = block.prev, block.next
        if prev is not None and prev.free:
            pool.remove(prev)
            prev.size += block.size
            prev.next = nxt
            if nxt is not None:
                nxt.prev = prev
            block = prev
        if nxt is not None and nxt.free:
            pool.remove(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
        pool.add(block)

    def _new_segment(self, size: int, small: bool) -> _Block:
        if self.limit is not None and self.reserved + size > self.limit:
            self._release_cache()
            if self.reserved + size > self.limit:
                raise AllocatorOutOfMemory
        # Segments get disjoint address ranges; the gap keeps blocks of different segments from
        # ever looking adjacent.
        block = _Block(self._next_address, size, small)
        self._next_address += size + LARGE_ROUNDING
        self.reserved += size
        self.segments += 1
        return block

    def _release_cache(self) -> None:
        """Give back every wholly free segment, as the allocator does when cudaMalloc fails."""
        for pool in self._pools.values():
            for block in pool.whole_segments():
                pool.remove(block)
                self.reserved -= block.size
                self.segments -= 1


def replay(
    events: Sequence[int],
    sizes: Sequence[int],
    persistent: Iterable[int] = (),
    limit: int | None = None,
) -> AllocatorReplay:
    """Replay a tracker's event log (id = allocated, ~id = freed) through the allocator model.

    `persistent` allocations are made first and never freed (the cuBLAS workspace, for one).
    With a `limit`, the replay stops at the first request that does not fit under it.
    """
    model = CachingAllocatorModel(limit)
    try:
        for size in persistent:
            model.malloc(size)
    except AllocatorOutOfMemory:
        return AllocatorReplay(model.reserved, -1, model.segments, oom_event=-1)
    peak, peak_event = model.reserved, -1
    blocks: dict[int, _Block] = {}
    for index, event in enumerate(events):
        if event >= 0:
            try:
                blocks[event] = model.malloc(sizes[event])
            except AllocatorOutOfMemory:
                return AllocatorReplay(peak, peak_event, model.segments, oom_event=index)
            if model.reserved > peak:
                peak, peak_event = model.reserved, index
        else:
            block = blocks.pop(~event, None)
            if block is not None:
                model.free(block)
    return AllocatorReplay(peak, peak_event, model.segments)


def required_memory(
    events: Sequence[int], sizes: Sequence[int], persistent: Sequence[int], limit: int
) -> Requirement:
    """How the run fares with the allocator limited to `limit`, and the least it needs."""
    plentiful = replay(events, sizes, persistent)
    if plentiful.peak_reserved_bytes <= limit:
        return Requirement(plentiful.peak_reserved_bytes, plentiful.peak_reserved_bytes, True, None)
    capped = replay(events, sizes, persistent, limit)
    fits = capped.oom_event is None
    # The least limit that works: between what is known to fail and what is known to work.
    works, fails = (limit, 0) if fits else (plentiful.peak_reserved_bytes, limit)
    while works - fails > LARGE_ROUNDING:
        middle = (works + fails) // 2
        if replay(events, sizes, persistent, middle).oom_event is None:
            works = middle
        else:
            fails = middle
    return Requirement(plentiful.peak_reserved_bytes, works, fits, capped.oom_event)
