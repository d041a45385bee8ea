"""A model of PyTorch's CUDA caching allocator, to turn allocated bytes into reserved bytes.

A GPU holds more than the live tensors: the caching allocator carves blocks out of segments it
obtained with cudaMalloc and keeps freed blocks cached, so the memory reserved from the driver
peaks above the allocated peak. Replaying the tracker's event log through the same rules gives the
reserved peak. Two settings of `PYTORCH_CUDA_ALLOC_CONF` are modelled (the `allocator` knob picks
one; `MODELS` has a model for each). The default rules follow c10/cuda/CUDACachingAllocator.cpp
with default settings (no `expandable_segments`, no `max_split_size_mb`, one stream):

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

With `expandable_segments:True` (`ExpandableSegmentsModel`; Note [Expandable Segments] and
find_expandable_block / map_block / try_allocate_expandable_block / unmap_block / should_split in
pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp, commit 001074d):

- each pool has one segment: a virtual address range (1 1/8 of the GPU's memory in torch, more
  than any limit here, so the model never needs a second) into which physical pages are mapped
  as needed: 2 MiB pages for the small pool, 20 MiB pages for the large pool (kSmallBuffer,
  kLargeBuffer); reserved memory is the mapped pages;
- a request takes the best-fitting free mapped block, except that a free block followed by
  unmapped space counts as the size it could grow to (so the segment's growing end is used last);
- with none, the segment grows at its lowest address that has room: the free block just before
  unmapped space, extended by mapping whole pages after it (only the shortfall is mapped);
- a block is split whenever the rest is at least 512 bytes, in both pools;
- freed blocks merge with free mapped neighbours, and stay mapped;
- when mapping would exceed the limit, every wholly free page of every free block is unmapped
  and the mapping retried; only if it still does not fit is the request out of memory.

So the reserved peak is the live bytes plus, per pool, the unused end of its last page and the
free holes between live blocks: there are no per-request segments to strand memory in.
Left out: several streams (a segment per stream; the probes run one), events that delay frees,
CUDA graph pools, torch's check of `set_per_process_memory_fraction` (it compares the default
segment size, not the pages to map, with the fraction: up to 20 MiB early under a cap), and the
rule that an expandable segment is given back whole once all its pages are unmapped (the
address range costs no memory).

Replaying a tracker's event log through these models, and the least memory a run needs, are
autofit/simulator/allocator_replay.py.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

MIB = 1 << 20
SMALL_REQUEST = 1 * MIB  # largest request served from the small pool
SMALL_SEGMENT = 2 * MIB
LARGE_SEGMENT = 20 * MIB  # segment for requests between 1 MiB and MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MIB
LARGE_ROUNDING = 2 * MIB
MIN_SPLIT_REMAINDER_SMALL = 512
# Expandable segments map physical memory in pages of these sizes (kSmallBuffer, kLargeBuffer).
SMALL_PAGE = 2 * MIB
LARGE_PAGE = 20 * MIB
# An expandable segment's address range: unbounded for the model (torch reserves more than the
# GPU holds, so the range never runs out before memory does).
ADDRESS_SPACE = 1 << 60
# Where each pool's segment starts: ranges apart, each starting on a whole page of either size
# (torch maps a segment's pages from its start), so that a segment's first page can be unmapped.
SEGMENT_SPACING = -(-2 * ADDRESS_SPACE // LARGE_PAGE) * LARGE_PAGE


def segment_size(request: int) -> int:
    """Bytes cudaMalloc'ed for a new segment that must hold `request` bytes."""
    if request <= SMALL_REQUEST:
        return SMALL_SEGMENT
    if request < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-request // LARGE_ROUNDING) * LARGE_ROUNDING


class Block:
    """A range of one segment: a live request, a free block, or (expandable segments) address
    space with no pages mapped; linked to its neighbours in the segment's address order."""

    __slots__ = ("address", "size", "small", "stream", "free", "mapped", "prev", "next")

    def __init__(
        self, address: int, size: int, small: bool, mapped: bool = True, stream: int = 0
    ) -> None:
        self.address = address
        self.size = size
        self.small = small
        self.stream = stream  # the CUDA stream whose requests its segment serves
        self.free = True
        self.mapped = mapped  # expandable segments only: whether pages back this range
        self.prev: Block | None = None
        self.next: Block | None = None


class _Pool:
    """Free blocks ordered by (size, address), for best-fit lookup."""

    def __init__(self) -> None:
        self._keys: list[tuple[int, int]] = []
        self._blocks: dict[int, Block] = {}

    def add(self, block: Block) -> None:
        bisect.insort(self._keys, (block.size, block.address))
        self._blocks[block.address] = block

    def remove(self, block: Block) -> None:
        index = bisect.bisect_left(self._keys, (block.size, block.address))
        del self._keys[index]
        del self._blocks[block.address]

    def whole_segments(self) -> list[Block]:
        return [b for b in self._blocks.values() if b.prev is None and b.next is None]

    def has_fit(self, size: int) -> bool:
        """Whether a free block of at least `size` bytes is here."""
        return bisect.bisect_left(self._keys, (size, -1)) < len(self._keys)

    def cloned(self, twin: dict[int, Block]) -> _Pool:
        """This pool over the clones of its blocks (`twin`: id of a block -> its clone)."""
        pool = _Pool()
        pool._keys = list(self._keys)
        pool._blocks = {address: twin[id(block)] for address, block in self._blocks.items()}
        return pool

    def best_fit(self, size: int) -> Block | None:
        index = bisect.bisect_left(self._keys, (size, -1))
        if index == len(self._keys):
            return None
        block = self._blocks[self._keys[index][1]]
        self.remove(block)
        return block

    def expandable_fit(self, size: int) -> Block | None:
        """get_free_block with expandable segments: from the smallest block that fits, step to
        the next larger one while that one could grow to less (a block followed by unmapped
        space counts as the size it could grow to)."""
        index = bisect.bisect_left(self._keys, (size, -1))
        if index == len(self._keys):
            return None

        def could_grow_to(i: int) -> int:
            block = self._blocks[self._keys[i][1]]
            after = block.next
            return block.size + (after.size if after is not None and not after.mapped else 0)

        while index + 1 < len(self._keys) and could_grow_to(index + 1) < could_grow_to(index):
            index += 1
        block = self._blocks[self._keys[index][1]]
        self.remove(block)
        return block

    def free_blocks(self) -> list[Block]:
        return list(self._blocks.values())


class AllocatorOutOfMemory(Exception):
    """A segment did not fit under the limit even after the cache was given back."""


PoolKey = tuple[int, bool]  # (stream, small): the caching allocator's pools are per stream


class CachingAllocatorModel:
    def __init__(self, limit: int | None = None) -> None:
        self._pools: dict[PoolKey, _Pool] = {}
        self._next_address = 0
        self.limit = limit
        self.reserved = 0
        self.segments = 0

    def _pool(self, stream: int, small: bool) -> _Pool:
        pool = self._pools.get((stream, small))
        if pool is None:
            pool = self._pools[stream, small] = _Pool()
        return pool

    def malloc(self, size: int, stream: int = 0) -> Block:
        small = size <= SMALL_REQUEST
        pool = self._pool(stream, small)
        block = pool.best_fit(size)
        if block is None:
            block = self._new_segment(segment_size(size), small, stream)
        remainder = block.size - size
        if small:
            split = remainder >= MIN_SPLIT_REMAINDER_SMALL
        else:
            split = remainder > SMALL_REQUEST
        if split:
            rest = Block(block.address + size, remainder, small, stream=stream)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            pool.add(rest)
        block.free = False
        return block

    def most_growth(self, size: int, stream: int = 0) -> int:
        """The most the reserved bytes can grow by for a request of `size` bytes on `stream`:
        none when a cached block of that stream fits it, else a new segment."""
        pool = self._pools.get((stream, size <= SMALL_REQUEST))
        return 0 if pool is not None and pool.has_fit(size) else segment_size(size)

    def cloned(self, twin: dict[int, Block]) -> CachingAllocatorModel:
        model = CachingAllocatorModel(self.limit)
        model._pools = {key: pool.cloned(twin) for key, pool in self._pools.items()}
        model._next_address, model.reserved = self._next_address, self.reserved
        model.segments = self.segments
        return model

    def blocks(self) -> Iterable[Block]:
        """The free blocks it holds (the rest hang off them, or off the caller's)."""
        for pool in self._pools.values():
            yield from pool.free_blocks()

    def free(self, block: Block) -> None:
        pool = self._pool(block.stream, block.small)
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

    def _new_segment(self, size: int, small: bool, stream: int = 0) -> Block:
        if self.limit is not None and self.reserved + size > self.limit:
            self._release_cache()
            if self.reserved + size > self.limit:
                raise AllocatorOutOfMemory
        # Segments get disjoint address ranges; the gap keeps blocks of different segments from
        # ever looking adjacent.
        block = Block(self._next_address, size, small, stream=stream)
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


def _link_after(block: Block, new: Block) -> None:
    """Put `new` right after `block` in its segment's address order."""
    new.prev, new.next = block, block.next
    if block.next is not None:
        block.next.prev = new
    block.next = new


def _absorb_next(block: Block) -> None:
    """`block` takes over the range of the block after it."""
    after = block.next
    assert after is not None
    block.size += after.size
    block.next = after.next
    if after.next is not None:
        after.next.prev = block


class ExpandableSegmentsModel:
    """The allocator with `expandable_segments:True` (module docstring): one growing segment per
    pool (a pool per stream and size class), reserved memory counted in mapped pages."""

    def __init__(self, limit: int | None = None) -> None:
        self._pools: dict[PoolKey, _Pool] = {}  # free mapped blocks
        self._page = {True: SMALL_PAGE, False: LARGE_PAGE}
        # Unmapped ranges by address, per pool. Each pool's segment starts as one range of its
        # own: pool k of the order they are first used starts k spacings in, disjoint.
        self._unmapped: dict[PoolKey, dict[int, Block]] = {}
        self.limit = limit
        self.reserved = 0
        self._mapped: dict[PoolKey, int] = {}
        for small in (True, False):  # the default stream's two, at the addresses they had
            self._pool(0, small)

    def _pool(self, stream: int, small: bool) -> _Pool:
        key = (stream, small)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool()
            base = SEGMENT_SPACING * len(self._unmapped)
            self._unmapped[key] = {
                base: Block(base, ADDRESS_SPACE, small, mapped=False, stream=stream)
            }
            self._mapped[key] = 0
        return pool

    @property
    def segments(self) -> int:
        """Expandable segments holding mapped pages."""
        return sum(1 for mapped in self._mapped.values() if mapped)

    def most_growth(self, size: int, stream: int = 0) -> int:
        """The most the reserved bytes can grow by for a request of `size` bytes on `stream`:
        none when a mapped free block of that stream fits it, else its whole pages."""
        small = size <= SMALL_REQUEST
        pool = self._pools.get((stream, small))
        if pool is not None and pool.has_fit(size):
            return 0
        return -(-size // self._page[small]) * self._page[small]

    def cloned(self, twin: dict[int, Block]) -> ExpandableSegmentsModel:
        model = ExpandableSegmentsModel(self.limit)
        model._pools = {key: pool.cloned(twin) for key, pool in self._pools.items()}
        model._unmapped = {
            key: {address: twin[id(block)] for address, block in ranges.items()}
            for key, ranges in self._unmapped.items()
        }
        model.reserved, model._mapped = self.reserved, dict(self._mapped)
        return model

    def blocks(self) -> Iterable[Block]:
        """The free and unmapped blocks it holds (the rest hang off them, or off the caller's)."""
        for pool in self._pools.values():
            yield from pool.free_blocks()
        for ranges in self._unmapped.values():
            yield from ranges.values()

    def malloc(self, size: int, stream: int = 0) -> Block:
        small = size <= SMALL_REQUEST
        pool = self._pool(stream, small)
        key = (stream, small)
        block = pool.expandable_fit(size)
        if block is None:
            block = self._grow(key, size)
            if block is None:
                self._release_cache()
                block = self._grow(key, size)
                if block is None:
                    raise AllocatorOutOfMemory
        if block.size - size >= MIN_SPLIT_REMAINDER_SMALL:  # either pool, with expandable segments
            rest = Block(block.address + size, block.size - size, small, stream=stream)
            _link_after(block, rest)
            block.size = size
            pool.add(rest)
        block.free = False
        return block

    def free(self, block: Block) -> None:
        block.free = True
        self._pools[block.stream, block.small].add(self._merge_free(block))

    def _merge_free(self, block: Block) -> Block:
        """Merge a free mapped block with its free mapped neighbours (taking them out of the
        pool); the merged block."""
        pool = self._pools[block.stream, block.small]
        prev = block.prev
        if prev is not None and prev.free and prev.mapped:
            pool.remove(prev)
            _absorb_next(prev)
            block = prev
        after = block.next
        if after is not None and after.free and after.mapped:
            pool.remove(after)
            _absorb_next(block)
        return block

    def _grow(self, key: PoolKey, size: int) -> Block | None:
        """try_allocate_expandable_block: the lowest place in the pool's segment with `size`
        bytes of free and unmapped space, mapped up to `size` (whole pages); None where mapping
        would exceed the limit (pages mapped before that stay mapped, free)."""
        candidate: Block | None = self._find_room(key, size)
        assert candidate is not None
        if not candidate.mapped:
            candidate = self._map(candidate, min(candidate.size, size))
        while candidate is not None and candidate.size < size:
            after = candidate.next
            assert after is not None and not after.mapped
            candidate = self._map(after, min(size - candidate.size, after.size))
        if candidate is not None:
            self._pools[key].remove(candidate)
        return candidate

    def _find_room(self, key: PoolKey, size: int) -> Block:
        """find_expandable_block: the lowest unmapped range (or the free block before it) from
        which free and unmapped space adds up to `size`."""
        unmapped = self._unmapped[key]
        for address in sorted(unmapped):
            block = unmapped[address]
            start = block.prev if block.prev is not None and block.prev.free else block
            room, walk = 0, start
            while walk is not None and room < size and walk.free:
                room += walk.size
                walk = walk.next
            if room >= size:
                return start
        raise AssertionError("an expandable segment's address range never runs out here")

    def _map(self, unmapped: Block, size: int) -> Block | None:
        """map_block: whole pages over the first `size` bytes of the (page-aligned) unmapped
        range, merged with free mapped neighbours; the merged free block, or None over the
        limit."""
        small, key = unmapped.small, (unmapped.stream, unmapped.small)
        page = self._page[small]
        mapped = min(-(-size // page) * page, unmapped.size)
        if self.limit is not None and self.reserved + mapped > self.limit:
            return None
        del self._unmapped[key][unmapped.address]
        if mapped < unmapped.size:
            rest = Block(
                unmapped.address + mapped, unmapped.size - mapped, small, mapped=False,
                stream=unmapped.stream,
            )  # fmt: skip
            _link_after(unmapped, rest)
            unmapped.size = mapped
            self._unmapped[key][rest.address] = rest
        unmapped.mapped = True
        self.reserved += mapped
        self._mapped[key] += mapped
        block = self._merge_free(unmapped)
        self._pools[key].add(block)
        return block

    def _release_cache(self) -> None:
        """release_cached_blocks / unmap_block: unmap every wholly free page of every free block
        of every pool; the bytes of a free block before its first and after its last whole page
        stay mapped."""
        for key, pool in self._pools.items():
            stream, small = key
            page = self._page[small]
            for block in pool.free_blocks():
                start = -(-block.address // page) * page
                end = (block.address + block.size) // page * page
                if end <= start:
                    continue
                pool.remove(block)
                if start > block.address:
                    _link_after(
                        block,
                        Block(start, block.address + block.size - start, small, stream=stream),
                    )
                    block.size = start - block.address
                    pool.add(block)
                    block = block.next  # type: ignore[assignment]
                if end < block.address + block.size:
                    _link_after(
                        block, Block(end, block.address + block.size - end, small, stream=stream)
                    )
                    block.size = end - block.address
                    pool.add(block.next)  # type: ignore[arg-type]
                block.mapped = False
                self.reserved -= block.size
                self._mapped[key] -= block.size
                unmapped = self._unmapped[key]
                after = block.next
                if after is not None and not after.mapped:
                    del unmapped[after.address]
                    _absorb_next(block)
                prev = block.prev
                if prev is not None and not prev.mapped:
                    _absorb_next(prev)
                    block = prev
                unmapped[block.address] = block


AllocatorModel = CachingAllocatorModel | ExpandableSegmentsModel

# One model per value of the `allocator` knob (autofit/knobs/allocator.py).
MODELS: dict[str, type[CachingAllocatorModel] | type[ExpandableSegmentsModel]] = {
    "default": CachingAllocatorModel,
    "expandable_segments": ExpandableSegmentsModel,
}
