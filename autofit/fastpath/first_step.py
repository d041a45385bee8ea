"""Two training steps from one forward and backward pass, and one pass for many optimizers.

A simulated probe tracks two steps: the first makes the optimizer's state, the second is the
steady state whose peak holds it (autofit/backends/base.py TRACKED_STEPS). Their forward and
backward passes are the same program, allocation for allocation, in a step whose pass leaves
nothing behind but the gradients, and the passes are most of a trace's cost. So a trace runs the
first step as its update alone, from gradients made directly (TrainingRun.update_without_a_pass),
then the second in full; `cut` takes the second step's pass out of the log, and `assemble` writes
the log the two full steps would have recorded:

    setup | pass, gradients renamed to the first update's | first update | tail (what the step
    frees after its update) | pass | second update | tail | what came after

Every allocation of a copied pass that is not a gradient gets an id of its own; ids are then
numbered in allocation order, as a tracker numbers them, so the log is the one a tracker of two
full steps keeps, to the byte (tests/test_first_step.py holds them side by side). Host memory the
pass takes and gives back (offloaded activations) is copied the same way, on the host's log.

A structure that differs from another only in what its update does (the optimizer, an EMA copy:
knobs whose values do not change the pass, `Knob.changes_pass_between`) runs the same pass, so its log is assembled from its own
setup and updates, both traced from gradients made directly (autofit/backends/simulate.py
`traced_updates`), and the other's pass: a search traces one pass for all the optimizers of a
structure (autofit/fastpath/scan.py), and their setups and updates once for all its structures
(autofit/fastpath/shared_updates.py).

`cut` checks what that rests on and returns None when it does not hold (the caller then traces
both steps whole): the pass gives every gradient the update reads (each trainable parameter's;
none for ZeRO-2, whose backward reduces them into a share of its own), and frees everything else
it allocates within the step, outside the update, on the GPU and on the host (a pass that made
state on its first call, such as a cache, would keep it: the first pass of the two would make
it, the second would not); neither the pass nor the tail reaches NVMe or waits on block swap's
exchanges, whose places in the step are priced. The bytes the pass moves (over the host link,
say) are kept with it, for the price of a step assembled from it. `assemble` checks that the
gradients the updates were given are the pass's, size for size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from autofit.simulator.roofline import Kernel
from autofit.simulator.step_log import StepLog, StepMarks, compact_phases


@dataclass(frozen=True)
class Pass:
    """A step's forward and backward pass and its tail, out of the log it was traced in: ids of
    its own (`raw_sizes`, `categories` by id), `grads` the trainable parameters' gradients in
    their order; phase changes and kernels' places counted from each part's first event, and
    the dispatched ops of each part (kernels and ops where the step was `priced`)."""

    events: tuple[int, ...]
    tail: tuple[int, ...]
    raw_sizes: tuple[int, ...]
    categories: tuple[int, ...]
    grads: tuple[int, ...]
    phases: tuple[tuple[int, str], ...]
    tail_phases: tuple[tuple[int, str], ...]
    kernels: tuple[Kernel, ...]
    tail_kernels: tuple[Kernel, ...]
    ops: int
    tail_ops: int
    priced: bool  # whether the kernels were kept (else none are here)
    # Host memory the pass and tail take and give back (activations offloaded in forward and
    # brought back in backward), ids of their own as above, the phase of each event; and the
    # bytes they move (ZeRO-Offload's gradients on their way to the host).
    host_events: tuple[int, ...] = ()
    host_tail: tuple[int, ...] = ()
    host_raw_sizes: tuple[int, ...] = ()
    host_pinned: tuple[bool | None, ...] = ()
    host_phases: tuple[str, ...] = ()
    host_tail_phases: tuple[str, ...] = ()
    moved: tuple[int, int, int] = (0, 0, 0)  # link, peer, host compute bytes (Position.moved)
    streams: tuple[int, ...] = ()  # the CUDA stream of each allocation, by id as `raw_sizes`


def cut(log: StepLog, step: StepMarks, kernels: Sequence[Kernel] | None) -> Pass | None:
    """The pass and tail of `step`, traced whole in `log` (its priced kernels `kernels`, when
    kept); None where the module docstring's conditions do not hold."""
    start, update, updated, end = step.start, step.update, step.updated, step.end
    if start.elsewhere != update.elsewhere or updated.elsewhere != end.elsewhere:
        return None  # the pass or the tail reaches NVMe, or waits on block swap's exchanges
    if None in step.grads:
        return None
    host = log.host_events
    host_body = host[start.host_events : update.host_events]
    host_tail = host[updated.host_events : end.host_events]
    if {e for e in (*host_body, *host_tail) if e >= 0} != {
        ~e for e in (*host_body, *host_tail) if e < 0
    }:
        return None  # host memory the pass keeps, or that it frees and did not take
    events = log.events
    body = events[step.start.events : step.update.events]
    tail = events[step.updated.events : step.end.events]
    allocated = {e for e in (*body, *tail) if e >= 0}
    freed = {~e for e in (*body, *tail) if e < 0}
    grads = set(step.grads)
    if freed - allocated or freed & grads:
        return None  # the pass frees what it did not make, or a gradient before the update
    if allocated - freed != grads or len(grads) != len(step.grads):
        # Something of the pass lives on into the update or beyond it (state its first call
        # makes, which a first pass would make and a second would not), or a gradient is missing.
        return None
    ids = _allocation_order((*body, *tail))
    host_ids = _allocation_order((*host_body, *host_tail))

    def priced(lo: int, hi: int, at: int) -> tuple[Kernel, ...]:
        return tuple(dataclasses.replace(k, at=k.at - at) for k in (kernels or [])[lo:hi])

    phases = log.host_event_phases
    moved = tuple(
        (a - b) + (c - d)
        for a, b, c, d in zip(update.moved, start.moved, end.moved, updated.moved, strict=True)
    )
    return Pass(
        tuple(_renamed(body, ids)), tuple(_renamed(tail, ids)),
        tuple(log.raw_sizes[a] for a in ids), tuple(log.categories[a] for a in ids),
        tuple(ids[g] for g in step.grads),
        tuple(_phases(log, start.events, update.events)),
        tuple(_phases(log, updated.events, end.events)),
        priced(start.kernels, update.kernels, start.events),
        priced(updated.kernels, end.kernels, updated.events),
        update.ops - start.ops, end.ops - updated.ops, kernels is not None,
        tuple(_renamed(host_body, host_ids)), tuple(_renamed(host_tail, host_ids)),
        tuple(log.host_raw_sizes[h] for h in host_ids), tuple(log.host_pinned[h] for h in host_ids),
        tuple(phases[start.host_events : update.host_events]),
        tuple(phases[updated.host_events : end.host_events]),
        moved,  # type: ignore[arg-type]
        tuple(log.streams[a] for a in ids),
    )  # fmt: skip


@dataclass(frozen=True)
class Assembled:
    """Two full steps' log, and the second step's priced kernels and dispatched ops."""

    log: StepLog
    kernels: list[Kernel]
    ops: int


def _assemblable(log: StepLog, first: StepMarks, second: StepMarks, pass_: Pass) -> bool:
    """Whether `assemble` can put `pass_` in both steps of `log`: the updates were given the
    pass's gradients, nothing else ran between the steps, and what the second step's own pass
    allocated is seen nowhere else."""
    if None in first.grads or None in second.grads:
        return False  # a gradient of no bytes: nothing to rename
    events = log.events
    made = events[first.start.events : first.update.events]
    if first.end.events != second.start.events or sorted(made) != sorted(first.grads):
        return False  # something ran between the steps, or more was made than the gradients
    if first.start.host_events != first.update.host_events:
        return False  # making the gradients took host memory
    sizes = [pass_.raw_sizes[g] for g in pass_.grads]
    for grads in (first.grads, second.grads):
        if len(grads) != len(sizes) or [log.raw_sizes[g] for g in grads] != sizes:  # type: ignore[index]
            return False
    # The second step's pass and tail as traced (the pass itself, or its gradients made
    # directly) give way to the copies: what they allocated must not be seen elsewhere, on the
    # GPU (but the gradients, which the update reads) or on the host.
    gpu = [p.events for p in (second.start, second.update, second.updated, second.end)]
    host = [p.host_events for p in (second.start, second.update, second.updated, second.end)]
    return not (
        _dropped_seen(events, gpu, set(second.grads)) or _dropped_seen(log.host_events, host)
    )


def assemble(
    log: StepLog,
    first: StepMarks,
    second: StepMarks,
    pass_: Pass,
    kernels: Sequence[Kernel] | None,
) -> Assembled | None:
    """The log of two full steps with `pass_` as both steps' pass: `log` holds the setup, the
    first step traced as its update alone (`first`), then the second (`second`: whole, or its
    update alone too), then whatever came after; `kernels` the second step's. None where the
    gradients the updates were given are not the pass's."""
    if not _assemblable(log, first, second, pass_):
        return None
    events = log.events
    raw_sizes, categories = list(log.raw_sizes), list(log.categories)
    streams = list(log.streams)
    spliced: list[int] = []
    phases: list[tuple[int, str]] = []
    steady: list[Kernel] = []

    def recorded(lo: int, hi: int, last: bool = False) -> None:
        phases.extend((index + len(spliced), phase) for index, phase in _phases(log, lo, hi, last))
        spliced.extend(events[lo:hi])

    def copied(
        run: Sequence[int], run_phases: Sequence[tuple[int, str]], names: dict[int, int]
    ) -> None:
        """A part of the pass, its ids named as `names` says (new ones added to it)."""

        def fresh(own: int) -> int:
            raw_sizes.append(pass_.raw_sizes[own])
            categories.append(pass_.categories[own])
            streams.append(pass_.streams[own])
            return len(raw_sizes) - 1

        phases.extend((index + len(spliced), phase) for index, phase in run_phases)
        spliced.extend(_copied(run, names, fresh))

    def priced(part: Sequence[Kernel], at: int) -> None:
        steady.extend(dataclasses.replace(k, at=k.at + at) for k in part)

    host_log = _HostSplice(log, pass_)
    recorded(0, first.start.events)
    host_log.recorded(0, first.start.host_events)
    for step in (first, second):
        # the pass's gradients are the ones this step's update was given
        names = dict(zip(pass_.grads, step.grads, strict=True))  # type: ignore[arg-type]
        if step is second:
            priced(pass_.kernels, len(spliced))
        copied(pass_.events, pass_.phases, names)
        host_log.copied(pass_.host_events, pass_.host_phases, {})
        update_at = len(spliced)
        recorded(step.update.events, step.updated.events)
        host_log.recorded(step.update.host_events, step.updated.host_events)
        if step is second:
            own = (kernels or [])[second.update.kernels : second.updated.kernels]
            priced(own, update_at - second.update.events)
            priced(pass_.tail_kernels, len(spliced))
        copied(pass_.tail, pass_.tail_phases, names)
        host_log.copied(pass_.host_tail, pass_.host_tail_phases, {})
    recorded(second.end.events, len(events), last=True)
    host_log.recorded(second.end.host_events, len(log.host_events))
    ops = pass_.ops + (second.updated.ops - second.update.ops) + pass_.tail_ops
    return Assembled(
        _numbered(raw_sizes, categories, streams, spliced, phases, host_log), steady, ops
    )


class _HostSplice:
    """The host log of the assembled steps, written as `assemble` writes the GPU's: parts of
    `log` as recorded, and copies of `pass_`'s with ids of their own."""

    def __init__(self, log: StepLog, pass_: Pass) -> None:
        self.log, self.pass_ = log, pass_
        self.raw_sizes, self.pinned = list(log.host_raw_sizes), list(log.host_pinned)
        self.events: list[int] = []
        self.phases: list[str] = []

    def recorded(self, lo: int, hi: int) -> None:
        self.events.extend(self.log.host_events[lo:hi])
        self.phases.extend(self.log.host_event_phases[lo:hi])

    def copied(self, run: Sequence[int], phases: Sequence[str], names: dict[int, int]) -> None:
        def fresh(own: int) -> int:
            self.raw_sizes.append(self.pass_.host_raw_sizes[own])
            self.pinned.append(self.pass_.host_pinned[own])
            return len(self.raw_sizes) - 1

        self.events.extend(_copied(run, names, fresh))
        self.phases.extend(phases)


def _phases(log: StepLog, lo: int, hi: int, last: bool = False) -> list[tuple[int, str]]:
    """The phase changes of events `lo`..`hi` of `log`, counted from `lo`: the phase at `lo`,
    then each change within (and, with `last`, after the end)."""
    within = [(i - lo, p) for i, p in log.phase_changes if lo < i and (i < hi or last)]
    return [(0, log.phase_at(lo)), *within]


def _numbered(
    raw_sizes: Sequence[int],
    categories: Sequence[int],
    streams: Sequence[int],
    events: Sequence[int],
    phase_changes: Sequence[tuple[int, str]],
    host: _HostSplice,
) -> StepLog:
    """The log with ids numbered in allocation order, the GPU's and the host's, as a tracker
    numbers them, and its phase changes in their least form (compact_phases)."""
    order, host_order = _allocation_order(events), _allocation_order(host.events)
    return StepLog.counted(
        [raw_sizes[aid] for aid in order],
        [categories[aid] for aid in order],
        _renamed(events, order),
        compact_phases(phase_changes),
        [host.raw_sizes[h] for h in host_order],
        [host.pinned[h] for h in host_order],
        _renamed(host.events, host_order),
        host.phases,
        [streams[aid] for aid in order],
    )  # fmt: skip


def _dropped_seen(
    events: Sequence[int], at: Sequence[int], spared: AbstractSet[int] = frozenset()
) -> bool:
    """Whether an allocation of a step's pass or tail (`at`: the step's start, update, updated
    and end in `events`), but those in `spared`, is seen outside them."""
    start, update, updated, end = at
    dropped = {e for e in (*events[start:update], *events[updated:end]) if e >= 0} - spared
    kept = (*events[:start], *events[update:updated], *events[end:])
    return any((e if e >= 0 else ~e) in dropped for e in kept)


def _allocation_order(events: Sequence[int]) -> dict[int, int]:
    """Each allocated id's place in allocation order (the dict iterates them in that order)."""
    order: dict[int, int] = {}
    for event in events:
        if event >= 0:
            order[event] = len(order)
    return order


def _renamed(events: Sequence[int], names: dict[int, int]) -> list[int]:
    """`events` with each id as `names` gives it (a free stays a free)."""
    return [names[e] if e >= 0 else ~names[~e] for e in events]


def _copied(events: Sequence[int], names: dict[int, int], fresh: Callable[[int], int]) -> list[int]:
    """`_renamed`, where an id `names` lacks first gets `fresh(id)`, added to `names`."""
    for event in events:
        own = event if event >= 0 else ~event
        if own not in names:
            names[own] = fresh(own)
    return _renamed(events, names)
