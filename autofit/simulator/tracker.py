"""A live-storage tracker: every byte a training step allocates, when, and what it is for.

It is a TorchDispatchMode: every ATen op's outputs pass through it, and each storage it has not
seen is an allocation; a weak reference tells it when the storage is freed. That is all a GPU's
allocator sees of a step, so the same tracker counts fake tensors (the `simulate` backend) and
real ones (`cpu`, `cuda`) alike. It records an event log (allocation ids, freed ids as `~id`) that
the caching-allocator model replays, the allocated peak and the phase it happened in.

Sizes are rounded up to 512 bytes as the CUDA caching allocator rounds every request, so the
allocated figures are those `torch.cuda.max_memory_allocated` would report for the same tensors.

Two things allocate without an op outputting a new storage, and the tracker follows both:

- A storage resized in place (`UntypedStorage.resize_`, which never dispatches, and the
  dispatched `aten.resize_` and `inductor.resize_storage_bytes_`): FSDP2 frees each gathered
  weight by resizing its storage to nothing and gathers the next step's weight back into the same
  storage (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, `free_storage`/`alloc_storage`).
  A resize frees the storage's allocation; one that leaves bytes is a new allocation of the new
  size, rounded as any, keeping the category the storage had: it holds the same thing again.
  While a tracker is entered, `UntypedStorage.resize_` tells it after each resize; nothing else
  is added to the work of an op that does not resize.
- A DTensor (FSDP2's sharded parameters, their gradients and optimizer state) is a wrapper with a
  storage of its own at the full size, which holds no memory: the memory is its local tensor's.
  The tracker lets DTensor's own dispatch run first (returning NotImplemented, as FakeTensorMode
  does for subclasses), so it sees the ops on the local tensors, and it tags a DTensor's local.

Categories are assigned by the training run (`tag`, `tag_live_since`) and the strongest wins:
parameters > gradients > optimizer_state > activations > temporaries. An allocation keeps its
category for its whole life, so the breakdown at the peak says what each live byte was for.

Host memory (offloaded optimizer state, swapped blocks, a CPU copy of the EMA weights, paged
optimizer state) is not GPU memory. On a real GPU the tracker counts only storages on the GPU; on
the CPU backends, where every tensor is on the CPU, storages created inside `host()` are marked
host memory and never counted as GPU memory, whatever later happens to them.

Host memory is counted on its own ledger (`host_report`), from the storages created inside
`host()` on every backend (storages a library makes on the CPU outside it, the process itself and
its libraries are not: the `cuda` backend reads the real process for those):

- pinned (`host(pinned=True)`: page-locked staging buffers) as torch's CachingHostAllocator holds
  them: each request rounded up to the next power of two, and a freed block kept for the next
  request of the same size, never handed back to the OS while training runs
  (aten/src/ATen/core/CachingHostAllocator.h, `allocate`: `PowerOf2Ceil(size)`; its
  `host_memory_stats` counts the same "active + cached" bytes; pytorch/pytorch#95823 and #150517
  report the resulting up-to-2x host use). DeepSpeed's pinned offload buffers
  (get_accelerator().pin_memory) and a non-blocking copy from the GPU to the CPU both go through it;
- pageable: the bytes of the live storages, as malloc hands them out. Paged optimizer state
  (bitsandbytes' paged optimizers, CUDA unified memory) counts here: its pages stay on the GPU
  until the GPU runs short, then the driver moves them to ordinary (not page-locked) host RAM,
  and a run at the edge of its GPU budget is when that happens, so the host must hold all of it
  (an upper bound: on a GPU with room to spare the host holds none);
- the model as a trainer loads it: a model autofit builds whole in host memory and then moves to
  the GPU stands for a checkpoint the trainer reads a shard at a time, so pageable storages made
  during setup and freed before setup ends (the loader's working set) count for at most
  `loader_cap` bytes at once (autofit/host.py says how large a shard is); what a loader leaves
  in host memory (swapped blocks, an offloaded pipeline) is resident and counts in full.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

from autofit.simulator.kernel_outputs import fake_device
from autofit.simulator.step_log import (  # noqa: F401  (re-exported: what a tracker records)
    _TEMPORARIES,
    CATEGORIES,
    HostReport,
    PeakReport,
    StepLog,
    compact_phases,
    round_allocation,
    round_pinned,
)

# Ops that change a storage's size in place (FSDP2 uses the inductor one under torch.compile).
_RESIZING_OPS = frozenset(
    op
    for op in (
        torch.ops.aten.resize_.default,
        torch.ops.aten.resize_as_.default,
        getattr(getattr(torch.ops.inductor, "resize_storage_bytes_", None), "default", None),
    )
    if op is not None
)

# Trackers entered now, told of every `UntypedStorage.resize_` while there are any.
_RESIZE_WATCHERS: list[MemoryTracker] = []
_STORAGE_RESIZE: Callable[..., Any] = torch.UntypedStorage.resize_


def _resize_and_tell(storage: torch.UntypedStorage, size: int) -> Any:
    result = _STORAGE_RESIZE(storage, size)
    for tracker in _RESIZE_WATCHERS:
        tracker._resized(storage)
    return result


_DTENSOR_TYPES: dict[type, bool] = {}  # subclass -> whether it is (derived from) DTensor


def _defers_to(types: Any) -> bool:
    """Whether an op's tensor subclasses include DTensor, whose dispatch must run first."""
    for kind in types:
        known = _DTENSOR_TYPES.get(kind)
        if known is None:
            known = _DTENSOR_TYPES[kind] = any(
                c.__name__ == "DTensor" and c.__module__.startswith("torch.distributed")
                for c in kind.__mro__
            )
        if known:
            return True
    return False


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor that holds a DTensor's memory (its local shard); any other tensor itself."""
    if type(tensor) is torch.Tensor:
        return tensor
    local = getattr(tensor, "_local_tensor", None)
    return tensor if local is None else local


class MemoryTracker(TorchDispatchMode, StepLog):
    """Counts storages created under it, into its StepLog. Enter it inside a FakeTensorMode to
    count fake tensors."""

    def __init__(self, device_type: str = "cpu") -> None:
        TorchDispatchMode.__init__(self)
        StepLog.__init__(self)
        # A compiled graph calls higher-order ops (a recomputed region's saved RNG state): each
        # runs as one op below this mode, and its outputs are seen here like any op's.
        self.supports_higher_order_operators = True
        self.device_type = device_type  # storages elsewhere are host memory
        self._host_depth = 0
        self._pinned_depth = 0  # host() contexts open with pinned=True
        self._host: dict[int, weakref.ref[Any]] = {}  # host storages: address -> weak ref
        # Host storages on the ledger: address -> (its live host allocation id, or None once
        # resized to nothing; pinned or not).
        self._host_ids: dict[int, tuple[int | None, bool]] = {}
        self._live: dict[int, int] = {}  # storage address -> allocation id, live storages only
        self._refs: dict[
            int, weakref.ref[Any]
        ] = {}  # allocation id -> weak ref (holds the callback)
        # Storages resized to nothing, still alive: address -> (weak ref, category index).
        self._emptied: dict[int, tuple[weakref.ref[Any], int]] = {}
        self.phase = "setup"
        self.current = 0
        self._uncounted_depth = 0  # inside uncounted(): new storages are not counted at all
        self.stream = 0  # the CUDA stream allocations are made on now (on_stream)
        self._collecting = False  # whether Python's collector ran before this tracker stopped it

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Off while torch.compile traces and compiles, on while the compiled graph runs: the
        compiled run's ops are counted, the compiler's own work is not (techniques/regional_compile.py)."""
        return True

    # -- recording -----------------------------------------------------------------------------

    def __enter__(self) -> Any:
        if not _RESIZE_WATCHERS:
            torch.UntypedStorage.resize_ = _resize_and_tell  # type: ignore[method-assign]
            # A storage caught in a reference cycle dies when Python's collector next runs,
            # which depends on every object the process made before: the same step then frees
            # it at one point in one trace and not at all in another. No collection runs under
            # a tracker, so a log does not hang on that history: what a cycle made under it
            # holds stays live to the end of the steps (on a GPU, until the next collection).
            self._collecting = gc.isenabled()
            gc.disable()
        _RESIZE_WATCHERS.append(self)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        # The log covers what happened under the tracker: storages freed later (when the caller
        # drops the model) are not events of the measured steps.
        _RESIZE_WATCHERS.remove(self)
        if not _RESIZE_WATCHERS:
            torch.UntypedStorage.resize_ = _STORAGE_RESIZE  # type: ignore[method-assign]
            if self._collecting:
                gc.enable()
        self._refs.clear()
        # Phase changes in one form however the steps were traced (two whole, or one assembled
        # from the other's pass: fastpath/first_step.py), so that traces compare.
        self.phase_changes = compact_phases(self.phase_changes)
        self._host.clear()
        self._host_ids.clear()
        self._emptied.clear()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if types and _defers_to(types):
            return NotImplemented  # DTensor runs the op on its local tensors, which come here
        device = fake_device(func, args)
        if device is not None:
            return device
        out = func(*args, **(kwargs or {}))
        if func in _RESIZING_OPS:
            self._resized(args[0].untyped_storage())
        self._see_all(out)
        return out

    def _see_all(self, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            self._see(out)
        elif isinstance(out, (tuple, list)):
            for item in out:
                self._see_all(item)

    def _see(self, tensor: torch.Tensor) -> int | None:
        if is_traceable_wrapper_subclass(tensor):
            # A wrapper (SDNQ's quantized weight) holds no memory of its own, only the tensors
            # inside it, which are seen as they are made; on real tensors its storage still
            # answers the logical size (SDNQ's int8 layer as a 16-bit one).
            return None
        return self._see_storage(tensor.untyped_storage())

    def _see_storage(self, storage: torch.UntypedStorage) -> int | None:
        key = storage._cdata
        known = self._live.get(key)
        if known is not None:
            return known
        if key in self._host or self._uncounted_depth:
            return None
        if self._host_depth or storage.device.type != self.device_type:
            # On a real GPU a storage made on it inside host() is still not host memory.
            off_gpu = self.device_type != "cuda" or storage.device.type != "cuda"
            on_ledger = bool(self._host_depth and off_gpu)
            if on_ledger:
                self._host_ids[key] = (
                    self._host_allocated(storage.nbytes()),
                    self._pinned_depth > 0,
                )
            self._host[key] = weakref.ref(storage, lambda _ref, key=key: self._host_freed(key))
            return None
        nbytes = storage.nbytes()
        if nbytes <= 0:  # CUDA hands out no block for an empty tensor
            return None
        return self._allocated(storage, key, nbytes)

    def _allocated(self, storage: torch.UntypedStorage, key: int, nbytes: int) -> int:
        aid = len(self.sizes)
        size = round_allocation(nbytes)
        self.sizes.append(size)
        self.raw_sizes.append(nbytes)
        self.categories.append(_TEMPORARIES)
        self.streams.append(self.stream)
        self._live[key] = aid
        self._refs[aid] = weakref.ref(storage, lambda _ref, key=key, aid=aid: self._freed(key, aid))
        self.events.append(aid)
        self.current += size
        if self.current > self.peak:
            self.peak = self.current
            self.peak_event = len(self.events) - 1
            self.peak_phase = self.phase
        if self.current > self.phase_peaks.get(self.phase, 0):
            self.phase_peaks[self.phase] = self.current
        return aid

    def _host_allocated(self, nbytes: int, pinned: bool | None = None) -> int | None:
        if nbytes <= 0:
            return None
        if pinned is None:
            pinned = self._pinned_depth > 0
        hid = len(self.host_sizes)
        self.host_sizes.append(round_pinned(nbytes) if pinned else nbytes)
        self.host_raw_sizes.append(nbytes)
        self.host_pinned.append(pinned)
        self.host_events.append(hid)
        self.host_event_phases.append(self.phase)
        return hid

    def _host_freed(self, key: int) -> None:
        self._host.pop(key, None)
        hid, _ = self._host_ids.pop(key, (None, False))
        if hid is not None:
            self.host_events.append(~hid)
            self.host_event_phases.append(self.phase)

    def _freed(self, key: int, aid: int) -> None:
        if self._live.get(key) == aid:
            del self._live[key]
        self._refs.pop(aid, None)
        self.events.append(~aid)
        self.current -= self.sizes[aid]

    def _resized(self, storage: torch.UntypedStorage) -> None:
        """`storage` was resized in place: its allocation is freed, and what it holds now (if
        anything) is a new allocation with the category it had (module docstring)."""
        key = storage._cdata
        size = round_allocation(storage.nbytes())
        aid = self._live.get(key)
        if aid is not None:
            if size == self.sizes[aid]:
                return
            category = self.categories[aid]
            self._freed(key, aid)  # drops the weak ref: the storage itself lives on
        elif key in self._emptied:
            _, category = self._emptied.pop(key)
        elif key in self._host:
            self._host_resized(storage, key)
            return
        else:  # first seen now: an allocation like any other
            self._see_storage(storage)
            return
        if size:
            self.categories[self._allocated(storage, key, storage.nbytes())] = category
        else:
            self._emptied[key] = (
                weakref.ref(storage, lambda _ref, key=key: self._emptied.pop(key, None)),
                category,
            )

    def _host_resized(self, storage: torch.UntypedStorage, key: int) -> None:
        if key not in self._host_ids:
            return  # not host memory the ledger counts
        hid, pinned = self._host_ids[key]
        nbytes = storage.nbytes()
        if hid is not None:
            if self.host_sizes[hid] == (round_pinned(nbytes) if pinned else nbytes):
                return
            self.host_events.append(~hid)
            self.host_event_phases.append(self.phase)
        self._host_ids[key] = (self._host_allocated(nbytes, pinned), pinned)

    # -- labelling -----------------------------------------------------------------------------

    def track(self, tensor: torch.Tensor, category: str) -> None:
        """Count a tensor made outside the tracker (or not yet seen) and give it a category."""
        aid = self._see(_local(tensor))
        if aid is not None:
            self._label(aid, CATEGORIES.index(category))

    def tag(self, tensor: torch.Tensor, category: str) -> None:
        tensor = _local(tensor)
        aid = self._live.get(tensor.untyped_storage()._cdata)
        if aid is None:
            self.track(tensor, category)
        else:
            self._label(aid, CATEGORIES.index(category))

    def _label(self, aid: int, index: int) -> None:
        if index < self.categories[aid]:
            self.categories[aid] = index

    def allocation_of(self, tensor: torch.Tensor) -> int | None:
        """The allocation id of a live tensor's storage (None: not GPU memory, or not seen)."""
        return self._live.get(_local(tensor).untyped_storage()._cdata)

    def mark(self) -> int:
        """An id boundary: allocations made after this call have ids >= the value returned."""
        return len(self.sizes)

    def tag_live_since(self, mark: int, category: str) -> None:
        """Give `category` to every allocation made since `mark` that is still live."""
        index = CATEGORIES.index(category)
        for aid in self._live.values():
            if aid >= mark:
                self._label(aid, index)

    @contextmanager
    def host(self, pinned: bool = False) -> Iterator[None]:
        """Storages created inside are host memory: never counted as GPU memory, counted on the
        host ledger. `pinned`: page-locked host memory (the staging buffers of offload and swap),
        which the host cannot page out; inside any pinned context, storages are pinned."""
        self._host_depth += 1
        self._pinned_depth += pinned
        try:
            yield
        finally:
            self._host_depth -= 1
            self._pinned_depth -= pinned

    @contextmanager
    def on_stream(self, stream: int) -> Iterator[None]:
        """Allocations made inside are made on CUDA stream `stream` (0: the default stream),
        whose own pool of the caching allocator serves them (FSDP1's all-gathers, say)."""
        previous, self.stream = self.stream, stream
        try:
            yield
        finally:
            self.stream = previous

    @contextmanager
    def uncounted(self) -> Iterator[None]:
        """Storages made inside are counted nowhere, neither GPU nor host memory: the
        temporaries of torch code that stands for a GPU kernel allocating none of them (TRL's
        Triton fold, autofit/techniques/trl_head.py). Nothing made inside may outlive it."""
        self._uncounted_depth += 1
        try:
            yield
        finally:
            self._uncounted_depth -= 1

    @contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        previous = self.phase
        self._set_phase(phase)
        try:
            yield
        finally:
            self._set_phase(previous)

    def _set_phase(self, phase: str) -> None:
        self.phase = phase
        self.phase_changes.append((len(self.events), phase))


@contextmanager
def uncounted() -> Iterator[None]:
    """Every entered tracker's `uncounted` at once (none entered: nothing to set aside)."""
    with ExitStack() as stack:
        for tracker in list(_RESIZE_WATCHERS):
            stack.enter_context(tracker.uncounted())
        yield
