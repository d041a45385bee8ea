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
- a freed block merges with free neighbours of the same segment and returns to its pool; segments
  are never given back (the allocator frees its cache only when a cudaMalloc fails, which an
  uncapped replay never sees).
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

    def best_fit(self, size: int) -> _Block | None:
        index = bisect.bisect_left(self._keys, (size, -1))
        if index == len(self._keys):
            return None
        block = self._blocks[self._keys[index][1]]
        self.remove(block)
        return block


@dataclass(frozen=True)
class AllocatorReplay:
    """What the replay saw: reserved bytes over time and their peak."""

    peak_reserved_bytes: int
    peak_event: int  # index of the event at which the reserved peak was reached (-1: before any)
    segments: int
    first_over_limit: (
        int | None
    )  # first event index with reserved bytes above `limit` (-1: at once)


class CachingAllocatorModel:
    def __init__(self) -> None:
        self._pools = {True: _Pool(), False: _Pool()}
        self._next_address = 0
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
        # Segments get disjoint address ranges; the gap keeps blocks of different segments from
        # ever looking adjacent.
        block = _Block(self._next_address, size, small)
        self._next_address += size + LARGE_ROUNDING
        self.reserved += size
        self.segments += 1
        return block


def replay(
    events: Sequence[int],
    sizes: Sequence[int],
    persistent: Iterable[int] = (),
    limit: int | None = None,
) -> AllocatorReplay:
    """Replay a tracker's event log (id = allocated, ~id = freed) through the allocator model.

    `persistent` allocations are made first and never freed (the cuBLAS workspace, for one).
    `limit` is the allocator's share of the budget: the replay notes when reserved bytes first
    exceed it, which is where a real run would have run out of memory.
    """
    model = CachingAllocatorModel()
    for size in persistent:
        model.malloc(size)
    peak, peak_event = model.reserved, -1
    over = -1 if limit is not None and model.reserved > limit else None
    blocks: dict[int, _Block] = {}
    for index, event in enumerate(events):
        if event >= 0:
            blocks[event] = model.malloc(sizes[event])
            if model.reserved > peak:
                peak, peak_event = model.reserved, index
                if over is None and limit is not None and peak > limit:
                    over = index
        else:
            block = blocks.pop(~event, None)
            if block is not None:
                model.free(block)
    return AllocatorReplay(peak, peak_event, model.segments, over)
