"""A live-storage tracker: every byte a training step allocates, when, and what it is for.

It is a TorchDispatchMode: every ATen op's outputs pass through it, and each storage it has not
seen is an allocation; a weak reference tells it when the storage is freed. That is all a GPU's
allocator sees of a step, so the same tracker counts fake tensors (the `simulate` backend) and
real ones (`cpu`, `cuda`) alike. It records an event log (allocation ids, freed ids as `~id`) that
the caching-allocator model replays, the allocated peak and the phase it happened in.

Sizes are rounded up to 512 bytes as the CUDA caching allocator rounds every request, so the
allocated figures are those `torch.cuda.max_memory_allocated` would report for the same tensors.

Categories are assigned by the training run (`tag`, `tag_live_since`) and the strongest wins:
parameters > gradients > optimizer_state > activations > temporaries. An allocation keeps its
category for its whole life, so the breakdown at the peak says what each live byte was for.

Host memory (offloaded optimizer state, swapped blocks, a CPU copy of the EMA weights, paged
optimizer state) is not GPU memory. On a real GPU the tracker counts only storages on the GPU; on
the CPU backends, where every tensor is on the CPU, storages created inside `host()` are marked
host memory and never counted, whatever later happens to them.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries")
_TEMPORARIES = CATEGORIES.index("temporaries")
ALLOCATION_GRANULARITY = 512  # CUDA caching allocator: every block is a multiple of 512 bytes


def round_allocation(nbytes: int) -> int:
    """The bytes the CUDA caching allocator hands out for a request of `nbytes` (0 stays 0)."""
    if nbytes <= 0:
        return 0
    return -(-nbytes // ALLOCATION_GRANULARITY) * ALLOCATION_GRANULARITY


@dataclass(frozen=True)
class PeakReport:
    """The allocated peak, where it happened, and what was live at that moment."""

    peak_allocated_bytes: int
    phase: str
    breakdown: dict[str, int]
    event_index: int
    phase_peaks: dict[str, int]


class MemoryTracker(TorchDispatchMode):
    """Counts storages created under it. Enter it inside a FakeTensorMode to count fake tensors."""

    def __init__(self, device_type: str = "cpu") -> None:
        super().__init__()
        self.device_type = device_type  # storages elsewhere are host memory
        self._host_depth = 0
        self._host: dict[int, weakref.ref[Any]] = {}  # host storages: address -> weak ref
        self._live: dict[int, int] = {}  # storage address -> allocation id, live storages only
        self._refs: dict[
            int, weakref.ref[Any]
        ] = {}  # allocation id -> weak ref (holds the callback)
        self.sizes: list[int] = []  # allocation id -> rounded bytes
        self.categories: list[int] = []  # allocation id -> index into CATEGORIES
        self.events: list[int] = []  # allocation id when allocated, ~id when freed
        self.phase_changes: list[tuple[int, str]] = [(0, "setup")]  # (first event index, phase)
        self.phase = "setup"
        self.current = 0
        self.peak = 0
        self.peak_event = -1
        self.peak_phase = "setup"
        self.phase_peaks: dict[str, int] = {}  # the allocated peak within each phase

    # -- recording -----------------------------------------------------------------------------

    def __exit__(self, *exc: Any) -> Any:
        # The log covers what happened under the tracker: storages freed later (when the caller
        # drops the model) are not events of the measured steps.
        self._refs.clear()
        self._host.clear()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self._see_all(out)
        return out

    def _see_all(self, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            self._see(out)
        elif isinstance(out, (tuple, list)):
            for item in out:
                self._see_all(item)

    def _see(self, tensor: torch.Tensor) -> int | None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        known = self._live.get(key)
        if known is not None:
            return known
        if key in self._host:
            return None
        if self._host_depth or storage.device.type != self.device_type:
            self._host[key] = weakref.ref(storage, lambda _ref, key=key: self._host.pop(key, None))
            return None
        size = round_allocation(storage.nbytes())
        if size == 0:  # CUDA hands out no block for an empty tensor
            return None
        aid = len(self.sizes)
        self.sizes.append(size)
        self.categories.append(_TEMPORARIES)
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

    def _freed(self, key: int, aid: int) -> None:
        if self._live.get(key) == aid:
            del self._live[key]
        self._refs.pop(aid, None)
        self.events.append(~aid)
        self.current -= self.sizes[aid]

    # -- labelling -----------------------------------------------------------------------------

    def track(self, tensor: torch.Tensor, category: str) -> None:
        """Count a tensor made outside the tracker (or not yet seen) and give it a category."""
        aid = self._see(tensor)
        if aid is not None:
            self._label(aid, CATEGORIES.index(category))

    def tag(self, tensor: torch.Tensor, category: str) -> None:
        aid = self._live.get(tensor.untyped_storage()._cdata)
        if aid is None:
            self.track(tensor, category)
        else:
            self._label(aid, CATEGORIES.index(category))

    def _label(self, aid: int, index: int) -> None:
        if index < self.categories[aid]:
            self.categories[aid] = index

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
        """Storages created inside are host memory: never counted as GPU memory. `pinned`:
        page-locked host memory (the staging buffers of offload and swap), which the host
        cannot page out."""
        self._host_depth += 1
        try:
            yield
        finally:
            self._host_depth -= 1

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

    # -- reading -------------------------------------------------------------------------------

    def phase_at(self, event_index: int) -> str:
        """The phase that was current when event `event_index` was recorded."""
        phase = "setup"
        for start, name in self.phase_changes:
            if start > event_index:
                break
            phase = name
        return phase

    def live_at(self, event_index: int) -> set[int]:
        """Allocation ids live just after event `event_index`."""
        live: set[int] = set()
        for event in self.events[: event_index + 1]:
            if event >= 0:
                live.add(event)
            else:
                live.discard(~event)
        return live

    def live_bytes(self, category: str) -> int:
        """Bytes of `category` live now (or when the tracker was exited)."""
        index = CATEGORIES.index(category)
        return sum(self.sizes[aid] for aid in self._live.values() if self.categories[aid] == index)

    def peak_report(self) -> PeakReport:
        breakdown = dict.fromkeys(CATEGORIES, 0)
        for aid in self.live_at(self.peak_event):
            breakdown[CATEGORIES[self.categories[aid]]] += self.sizes[aid]
        return PeakReport(
            self.peak, self.peak_phase, breakdown, self.peak_event, dict(self.phase_peaks)
        )
