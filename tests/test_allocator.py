"""The caching-allocator model follows CUDACachingAllocator's rules, checked on sequences whose
reserved bytes can be worked out by hand."""

from __future__ import annotations

import pytest

from autofit.simulator.allocator import CachingAllocatorModel, segment_size
from autofit.simulator.allocator_replay import replay, required_memory

MIB = 1 << 20


@pytest.mark.parametrize(
    "request_bytes,segment",
    [
        (512, 2 * MIB),  # small pool: 2 MiB segments
        (1 * MIB, 2 * MIB),
        (1 * MIB + 512, 20 * MIB),  # 1-10 MiB: a 20 MiB segment to carve from
        (10 * MIB - 512, 20 * MIB),
        (10 * MIB, 10 * MIB),  # from 10 MiB: the request rounded up to 2 MiB
        (11 * MIB + 512, 12 * MIB),
    ],
)
def test_segment_sizes(request_bytes: int, segment: int) -> None:
    assert segment_size(request_bytes) == segment


def test_small_blocks_pack_into_two_mib_segments() -> None:
    model = CachingAllocatorModel()
    for _ in range(4096):  # 4096 x 512 B = exactly one 2 MiB segment
        model.malloc(512)
    assert model.reserved == 2 * MIB
    model.malloc(512)
    assert model.reserved == 4 * MIB


def test_a_freed_block_is_split_for_a_smaller_request() -> None:
    model = CachingAllocatorModel()
    model.free(model.malloc(30 * MIB))
    model.malloc(12 * MIB)  # takes 12 MiB of the cached 30, leaves 18 MiB free
    model.malloc(17 * MIB)  # fits the 18 MiB remainder
    assert model.reserved == 30 * MIB
    assert model.segments == 1


def test_large_remainders_of_one_mib_or_less_are_not_split() -> None:
    model = CachingAllocatorModel()
    model.free(model.malloc(12 * MIB))
    model.malloc(11 * MIB)  # takes the whole 12 MiB block: a 1 MiB rest is not split off
    model.malloc(1 * MIB + 512)  # so this needs a segment of its own (20 MiB)
    assert model.reserved == 12 * MIB + 20 * MIB


def test_freed_neighbours_merge() -> None:
    model = CachingAllocatorModel()
    model.free(model.malloc(30 * MIB))
    a, b = model.malloc(10 * MIB), model.malloc(10 * MIB)
    model.free(a)
    model.free(b)
    model.malloc(30 * MIB)  # the three pieces merged back into one 30 MiB block
    assert model.reserved == 30 * MIB
    assert model.segments == 1


def test_best_fit_picks_the_smallest_block_that_fits() -> None:
    model = CachingAllocatorModel()
    big, small = model.malloc(40 * MIB), model.malloc(12 * MIB)
    model.free(big)
    model.free(small)
    model.malloc(12 * MIB)  # goes into the 12 MiB block, leaving the 40 MiB one whole
    model.malloc(40 * MIB)
    assert model.reserved == 52 * MIB


def test_fragmentation_reserves_more_than_is_allocated() -> None:
    model = CachingAllocatorModel()
    first = model.malloc(12 * MIB)
    model.malloc(12 * MIB)
    model.free(first)
    model.malloc(14 * MIB)  # 12 MiB are free, but not 14 in one piece
    assert model.reserved == 12 * MIB + 12 * MIB + 14 * MIB


def test_replay_reports_the_reserved_peak() -> None:
    sizes = [12 * MIB, 12 * MIB, 14 * MIB]
    events = [0, 1, ~0, 2, ~1, ~2]
    replayed = replay(events, sizes, persistent=[512])
    # The persistent 512 B block takes a 2 MiB small segment; fragmentation adds a 14 MiB one.
    assert replayed.peak_reserved_bytes == 2 * MIB + 38 * MIB
    assert replayed.peak_event == 3
    assert replayed.oom_event is None


def test_under_a_limit_the_cache_is_given_back_before_running_out() -> None:
    sizes = [12 * MIB, 12 * MIB, 14 * MIB]
    events = [0, 1, ~0, 2, ~1, ~2]
    # 24 MiB reserved when the 14 MiB request comes; a 30 MiB limit leaves no room for 14 more,
    # but the first 12 MiB segment is wholly free: given back, it makes room (12 + 14 = 26).
    assert replay(events, sizes, limit=30 * MIB).oom_event is None
    # With 25 MiB, 12 + 14 still do not fit: the request at event 3 runs out.
    assert replay(events, sizes, limit=25 * MIB).oom_event == 3


def test_the_requirement_is_the_least_limit_that_works() -> None:
    sizes = [12 * MIB, 12 * MIB, 14 * MIB]
    events = [0, 1, ~0, 2, ~1, ~2]
    roomy = required_memory(events, sizes, [], limit=64 * MIB)
    assert (roomy.reserved_when_plentiful, roomy.required, roomy.fits) == (38 * MIB, 38 * MIB, True)
    tight = required_memory(events, sizes, [], limit=30 * MIB)
    assert tight.fits and tight.reserved_when_plentiful == 38 * MIB
    assert 26 * MIB <= tight.required <= 28 * MIB  # 12 + 14 MiB live at once, to 2 MiB
    short = required_memory(events, sizes, [], limit=20 * MIB)
    assert not short.fits and short.oom_event == 1
    assert 26 * MIB <= short.required <= 28 * MIB


# --- one pool per CUDA stream (CUDACachingAllocator's get_free_block matches the stream) -------


@pytest.mark.parametrize("allocator", ["default", "expandable_segments"])
def test_a_block_freed_on_one_stream_serves_no_request_of_another(allocator: str) -> None:
    """An all-gather's block (stream 1) freed and an activation of its size asked for on the
    default stream: a second segment, where one stream would have reused the block; the same
    request on stream 1 reuses it."""
    mib = 1 << 20
    sizes = [100 * mib, 100 * mib]
    events = [0, ~0, 1]
    one_stream = replay(events, sizes, allocator=allocator).peak_reserved_bytes
    two = replay(events, sizes, allocator=allocator, streams=[1, 0]).peak_reserved_bytes
    same = replay(events, sizes, allocator=allocator, streams=[1, 1]).peak_reserved_bytes
    assert one_stream == same == 100 * mib
    assert two == 200 * mib


@pytest.mark.parametrize("allocator", ["default", "expandable_segments"])
def test_short_of_memory_every_streams_cache_is_given_back(allocator: str) -> None:
    """Under a limit the cached block of the other stream is released before running out, as
    release_cached_blocks frees every stream's wholly free segments."""
    mib = 1 << 20
    done = replay([0, ~0, 1], [100 * mib] * 2, limit=150 * mib, allocator=allocator, streams=[1, 0])
    assert done.oom_event is None
    need = required_memory([0, ~0, 1], [100 * mib] * 2, [], 150 * mib, allocator, streams=[1, 0])
    assert need.fits and need.reserved_when_plentiful == 200 * mib
    assert 100 * mib <= need.required <= 102 * mib  # the least limit, to the search's 2 MiB
