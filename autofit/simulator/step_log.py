"""What a tracked training step did with memory, as data: the log a `MemoryTracker` records,
and what the simulator reads from it (the allocated peak and its phase, what was live at it, the
host memory's peak).

A `StepLog` is also what a batch curve (autofit/fastpath/batch_curve.py) answers for a batch it
did not trace: the same events with the sizes that batch gives them. `StepLog.counted` computes
the running figures a tracker keeps as it records (the peak, the event it happened at, each
phase's peak) from the events alone, by the tracker's own rules, so both give the same report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from autofit.records.categories import CATEGORIES, Category

_TEMPORARIES = CATEGORIES.index(Category.TEMPORARIES)
ALLOCATION_GRANULARITY = 512  # CUDA caching allocator: every block is a multiple of 512 bytes


def round_allocation(nbytes: int) -> int:
    """The bytes the CUDA caching allocator hands out for a request of `nbytes` (0 stays 0)."""
    if nbytes <= 0:
        return 0
    return -(-nbytes // ALLOCATION_GRANULARITY) * ALLOCATION_GRANULARITY


def compact_phases(changes: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
    """Phase changes in their least form, which says the same phase for every event: of the
    changes at one event, the last; and only changes to a phase other than the current one."""
    out: list[tuple[int, str]] = [(0, "setup")]
    for index, phase in changes:
        if out[-1][0] == index and len(out) > 1:
            out.pop()
        if out[-1][1] != phase:
            out.append((index, phase))
    return out


@dataclass(frozen=True)
class PeakReport:
    """The allocated peak, where it happened, and what was live at that moment."""

    peak_allocated_bytes: int
    phase: str
    breakdown: dict[str, int]
    event_index: int
    phase_peaks: dict[str, int]


def round_pinned(nbytes: int) -> int:
    """The bytes torch's CUDA host allocator takes for a pinned request: the next power of two."""
    if nbytes <= 0:
        return 0
    return 1 << (nbytes - 1).bit_length()


@dataclass(frozen=True)
class HostReport:
    """The host memory peak of the tracked steps and what it held (bytes). `pinned_bytes` and
    `pageable_bytes` sum to `peak_bytes`; `loader_bytes` is the part of the pageable bytes that
    was a loader's working set (capped at one shard)."""

    peak_bytes: int
    pinned_bytes: int
    pageable_bytes: int
    loader_bytes: int
    phase: str
    phase_peaks: dict[str, int]


class Position(NamedTuple):
    """How far a tracked run had got: the GPU events its log held; what it had done off the GPU,
    which stands still while it does nothing there: its host events, the bytes it had `moved`
    (over the host link, to the other GPUs, through the host's CPU) and what it had done
    `elsewhere` (bytes to and from NVMe, in the step and in the update; block swap's
    exchanges); and the kernels priced and ops dispatched so far in the step being priced."""

    events: int
    host_events: int = 0
    moved: tuple[int, int, int] = (0, 0, 0)
    elsewhere: tuple[int, int, int] = (0, 0, 0)
    kernels: int = 0
    ops: int = 0


@dataclass(frozen=True)
class StepMarks:
    """Where one tracked step's parts lie: it begins at `start`, its update (the optimizer
    phase) runs from `update` to `updated`, and it ends at `end`. `grads` holds each trainable
    parameter's gradient as the update found it: its allocation id (None: no gradient on the
    GPU)."""

    start: Position
    update: Position
    updated: Position
    end: Position
    grads: tuple[int | None, ...]


class StepLog:
    """The GPU and host allocation logs of tracked steps.

    GPU: `sizes[id]` the rounded bytes of allocation `id`, `raw_sizes[id]` the bytes requested,
    `categories[id]` an index into CATEGORIES, `streams[id]` the CUDA stream it was made on (0:
    the default one; the caching allocator keeps a pool per stream); `events` holds `id` when allocated and `~id` when
    freed; `phase_changes` (first event index, phase) in order. Host: the same per host
    allocation (`host_sizes` as the host allocator holds them: pinned rounded to a power of two,
    `host_raw_sizes` as requested), with the phase of each host event."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.raw_sizes: list[int] = []
        self.categories: list[int] = []
        self.streams: list[int] = []
        self.events: list[int] = []
        self.phase_changes: list[tuple[int, str]] = [(0, "setup")]
        self.host_sizes: list[int] = []
        self.host_raw_sizes: list[int] = []
        self.host_pinned: list[bool] = []
        self.host_events: list[int] = []
        self.host_event_phases: list[str] = []
        self.peak = 0
        self.peak_event = -1
        self.peak_phase = "setup"
        self.phase_peaks: dict[str, int] = {}  # the allocated peak within each phase
        # What the allocator model reserves at most replaying these events with no limit, by
        # (persistent allocations, `allocator` setting), once a replay found it: a scan asks
        # whether a batch fits, then for its figures, of one log (autofit/fastpath/scan.py).
        self.plentiful_reserved: dict[tuple[tuple[int, ...], str], int] = {}

    @classmethod
    def counted(
        cls,
        raw_sizes: Sequence[int],
        categories: Sequence[int],
        events: Sequence[int],
        phase_changes: Sequence[tuple[int, str]],
        host_raw_sizes: Sequence[int],
        host_pinned: Sequence[bool],
        host_events: Sequence[int],
        host_event_phases: Sequence[str],
        streams: Sequence[int] | None = None,
    ) -> StepLog:
        """A log from its events and requested sizes, with the running figures a tracker keeps
        while recording (MemoryTracker._allocated) counted over the events in order."""
        log = cls()
        log.raw_sizes = list(raw_sizes)
        log.sizes = sizes = [round_allocation(n) for n in raw_sizes]
        log.categories, log.events = list(categories), list(events)
        log.streams = list(streams) if streams is not None else [0] * len(raw_sizes)
        log.phase_changes = list(phase_changes)
        log.host_raw_sizes, log.host_pinned = list(host_raw_sizes), list(host_pinned)
        log.host_sizes = [
            round_pinned(n) if pinned else n
            for n, pinned in zip(host_raw_sizes, host_pinned, strict=True)
        ]
        log.host_events, log.host_event_phases = list(host_events), list(host_event_phases)
        changes, next_change, phase = log.phase_changes, 0, "setup"
        current = peak = 0
        peak_event, peak_phase, phase_peaks = -1, "setup", log.phase_peaks
        for index, event in enumerate(events):
            while next_change < len(changes) and changes[next_change][0] <= index:
                phase = changes[next_change][1]
                next_change += 1
            if event >= 0:
                current += sizes[event]
                if current > peak:
                    peak, peak_event, peak_phase = current, index, phase
                if current > phase_peaks.get(phase, 0):
                    phase_peaks[phase] = current
            else:
                current -= sizes[~event]
        log.peak, log.peak_event, log.peak_phase = peak, peak_event, peak_phase
        return log

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
        """Bytes of `category` live at the end of the log (now, for a tracker recording it)."""
        index = CATEGORIES.index(category)
        live = self.live_at(len(self.events) - 1)
        return sum(self.sizes[aid] for aid in live if self.categories[aid] == index)

    def peak_report(self) -> PeakReport:
        breakdown = dict.fromkeys(CATEGORIES, 0)
        for aid in self.live_at(self.peak_event):
            breakdown[CATEGORIES[self.categories[aid]]] += self.sizes[aid]
        return PeakReport(
            self.peak, self.peak_phase, breakdown, self.peak_event, dict(self.phase_peaks)
        )

    # -- host memory ---------------------------------------------------------------------------

    def host_live_bytes(self, pinned: bool | None = None) -> int:
        """Host bytes of live storages now (or when the tracker was exited), pinned ones rounded
        as the host allocator rounds them (its cache aside); `pinned` picks one kind."""
        live: dict[int, None] = {}
        for event in self.host_events:
            if event >= 0:
                live[event] = None
            else:
                live.pop(~event, None)
        return sum(
            self.host_sizes[hid]
            for hid in live
            if pinned is None or self.host_pinned[hid] == pinned
        )

    def _loader_working_set(self) -> set[int]:
        """Pageable host allocations made during setup and freed before it ended."""
        born: set[int] = set()
        transient: set[int] = set()
        for event, phase in zip(self.host_events, self.host_event_phases, strict=True):
            if phase != "setup":
                break
            if event >= 0:
                if not self.host_pinned[event]:
                    born.add(event)
            elif ~event in born:
                transient.add(~event)
        return transient

    def host_report(
        self, loader_cap: int | None = None, ranks: int = 1, loader_ranks: int | None = None
    ) -> HostReport:
        """The host peak (module docstring: pinned as the caching host allocator holds it,
        pageable live, the loader's working set at most `loader_cap`; None: counted in full),
        of `ranks` processes like this one on one machine, `loader_ranks` of which (default:
        all) read the checkpoint."""
        readers = ranks if loader_ranks is None else loader_ranks
        transient = self._loader_working_set()
        cached: dict[int, int] = {}  # pinned block size -> blocks the allocator holds
        in_use: dict[int, int] = {}  # pinned block size -> blocks handed out now
        pinned = pageable = loading = 0
        best = (0, 0, 0, 0, "setup")
        phase_peaks: dict[str, int] = {}
        for event, phase in zip(self.host_events, self.host_event_phases, strict=True):
            hid = event if event >= 0 else ~event
            size, sign = self.host_sizes[hid], (1 if event >= 0 else -1)
            if self.host_pinned[hid]:
                in_use[size] = in_use.get(size, 0) + sign
                if in_use[size] > cached.get(size, 0):
                    cached[size] = in_use[size]
                    pinned += size
            elif hid in transient:
                loading += sign * size
            else:
                pageable += sign * size
            loader = readers * (loading if loader_cap is None else min(loading, loader_cap))
            total = ranks * (pinned + pageable) + loader
            if total > best[0]:
                best = (total, ranks * pinned, ranks * pageable + loader, loader, phase)
            if total > phase_peaks.get(phase, 0):
                phase_peaks[phase] = total
        peak, pinned_at, pageable_at, loader_at, phase_at = best
        return HostReport(peak, pinned_at, pageable_at, loader_at, phase_at, phase_peaks)
