"""The tracker follows storages resized in place (FSDP2 frees and re-gathers its weights so) and
counts a DTensor's local shard, never its wrapper: real tensors and fake ones alike."""

from __future__ import annotations

import gc
import os
from contextlib import ExitStack

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from autofit.simulator.tracker import CATEGORIES, MemoryTracker


def _tracked(fake: bool) -> tuple[ExitStack, MemoryTracker]:
    stack = ExitStack()
    if fake:
        stack.enter_context(FakeTensorMode())
    tracker = MemoryTracker(device_type="meta" if fake else "cpu")
    stack.enter_context(tracker)
    return stack, tracker


def _log(tracker: MemoryTracker) -> list[tuple[str, int]]:
    return [("+" if e >= 0 else "-", tracker.sizes[e if e >= 0 else ~e]) for e in tracker.events]


@pytest.mark.parametrize("fake", [False, True])
def test_a_storage_resized_to_nothing_is_freed_and_regrown_is_a_new_allocation(fake: bool) -> None:
    stack, tracker = _tracked(fake)
    with stack:
        weight = torch.empty(1000)  # 4000 bytes: one 4096-byte block
        tracker.tag(weight, "parameters")
        storage = weight.untyped_storage()
        storage.resize_(0)  # FSDP2's free_storage
        assert tracker.current == 0
        other = torch.empty(300)  # 1200 bytes while the weight holds none
        storage.resize_(1000 * 4)  # alloc_storage: the same storage holds the weight again
        storage.resize_(1000 * 4)  # the same size: nothing happens
        del other
        storage.resize_(5000)  # grown: freed, and a new block of the new size
    assert _log(tracker) == [
        ("+", 4096), ("-", 4096), ("+", 1536), ("+", 4096), ("-", 1536), ("-", 4096), ("+", 5120),
    ]  # fmt: skip
    assert tracker.peak == 4096 + 1536
    assert tracker.live_bytes("parameters") == 5120  # the storage keeps what it held
    assert tracker.categories[-1] == CATEGORIES.index("parameters")


@pytest.mark.parametrize("fake", [False, True])
def test_a_tensor_resized_by_an_op_grows_its_allocation(fake: bool) -> None:
    stack, tracker = _tracked(fake)
    with stack:
        grown = torch.empty(100)  # 400 bytes
        grown.resize_(1000)  # aten.resize_ grows the same storage in place
        assert tracker.current == 4096
    assert _log(tracker) == [("+", 512), ("-", 512), ("+", 4096)]


def test_a_storage_freed_for_good_after_a_resize_is_freed_once() -> None:
    tracker = MemoryTracker(device_type="cpu")
    with tracker:
        weight = torch.empty(1000)
        weight.untyped_storage().resize_(0)
        del weight  # the emptied storage dies: no second free
        kept = torch.empty(1000)
        kept.untyped_storage().resize_(2000 * 4)
        del kept
    assert _log(tracker) == [("+", 4096), ("-", 4096), ("+", 4096), ("-", 4096), ("+", 8192),
                             ("-", 8192)]  # fmt: skip
    assert tracker.current == 0


def test_host_storages_resized_move_on_the_host_ledger() -> None:
    tracker = MemoryTracker(device_type="cpu")
    with tracker:
        with tracker.host(pinned=True):
            staging = torch.empty(1000)  # 4000 bytes, pinned: a 4096-byte host block
        staging.untyped_storage().resize_(0)
        assert tracker.host_live_bytes() == 0
        staging.untyped_storage().resize_(5000)  # still pinned: 8192
        assert tracker.host_live_bytes(pinned=True) == 8192
        assert tracker.current == 0  # never GPU memory
    assert tracker.host_sizes == [4096, 8192]


def test_the_storage_method_is_restored_when_no_tracker_is_entered() -> None:
    resize = torch.UntypedStorage.resize_
    with MemoryTracker(device_type="cpu"):
        assert torch.UntypedStorage.resize_ is not resize
        with MemoryTracker(device_type="cpu") as inner:
            torch.empty(10).untyped_storage().resize_(0)
        assert torch.UntypedStorage.resize_ is not resize
    assert torch.UntypedStorage.resize_ is resize
    assert _log(inner) == [("+", 512), ("-", 512)]


def _mesh():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533")):
            os.environ.setdefault(key, value)
        dist.init_process_group("gloo", rank=0, world_size=1)
    return init_device_mesh("cpu", (1,))


def test_a_dtensor_counts_its_local_shard_and_never_its_wrapper() -> None:
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = _mesh()
    tracker = MemoryTracker(device_type="cpu")
    with tracker:
        weight = distribute_tensor(torch.ones(64, 64), mesh, [Shard(0)])  # 16384 bytes
        tracker.tag(weight, "parameters")
        doubled = weight * 2  # DTensor's own dispatch runs the op on the local shard
        assert type(doubled).__name__ == "DTensor"
        tracker.tag(doubled, "activations")
        assert tracker.current == 2 * 16384
        local = doubled.to_local()
        assert tracker._live[local.untyped_storage()._cdata] is not None
        assert doubled.untyped_storage()._cdata not in tracker._live  # the wrapper's own
        del doubled, local
        assert tracker.current == 16384
    assert tracker.live_bytes("parameters") == 16384


def test_a_storage_in_a_reference_cycle_stays_live_to_the_end_of_the_trace() -> None:
    """Python's collector runs when the objects made since it last ran pass a threshold, which
    depends on the process's whole history: a storage caught in a cycle was freed mid-step in one
    trace and not in another (the compiled Llama's fake and real logs differed after a few runs in
    one process). No collection runs under a tracker, and the collector is back on after it."""
    assert gc.isenabled()
    with MemoryTracker() as tracker:
        holder: dict[str, object] = {"tensor": torch.empty(128)}
        holder["self"] = holder  # a cycle: only the collector frees it
        del holder
        kept = [[] for _ in range(100_000)]  # objects enough to set the collector off, if on
        del kept
        assert not gc.isenabled()
        assert all(event >= 0 for event in tracker.events)  # allocated, never freed
    assert gc.isenabled()
