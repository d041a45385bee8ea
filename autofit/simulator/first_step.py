"""Two training steps from one forward and backward pass.

A simulated probe tracks two steps: the first makes the optimizer's state, the second is the
steady state whose peak holds it (autofit/backends/base.py TRACKED_STEPS). Their forward and
backward passes are the same program, allocation for allocation, in a step whose pass leaves
nothing behind but the gradients; tracing both costs two thirds of a trace. So the first step is
traced as its update alone, from gradients made directly (TrainingRun.update_without_a_pass),
then the second in full, and `splice` writes the log the two full steps would have recorded:

    setup | second step's pass, gradients renamed to the first's | first update | second step's
    tail (what the step frees after its update) | the second step, whole | what came after

Every allocation of the copied pass that is not a gradient gets an id of its own; ids are then
numbered in allocation order, as a tracker numbers them, so the log is the one a tracker of two
full steps keeps, to the byte (tests/test_first_step.py holds them side by side).

`splice` checks what that rests on and returns None when it does not hold (the caller then traces
both steps): the pass gives every trainable parameter a gradient of the size the first update
was given, and frees everything else it allocates within the step, outside the update (a pass
that made state on its first call, such as a cache, would keep it: the first pass of the two
would make it, the second would not); and neither the pass nor the tail touches host memory.
The updates are traced as they run, state they replace at every step included.
"""

from __future__ import annotations

from collections.abc import Sequence

from autofit.simulator.step_log import StepLog, StepMarks


def splice(log: StepLog, first: StepMarks, second: StepMarks) -> tuple[StepLog, int] | None:
    """The log of two full steps, from `log`: a first step traced as its update alone
    (`first`), then a whole step (`second`), then whatever came after. Also how far the second
    step's events moved (its kernels' places among the allocations move with them). None where
    the module docstring's conditions do not hold."""
    events = log.events
    (start, host_start), (update, host_update) = second.start, second.update
    (updated, host_updated), (end, host_end) = second.updated, second.end
    if first.end != second.start or host_start != host_update or host_updated != host_end:
        return None  # something ran between the two, or the pass or tail touched host memory
    if first.start[1] != first.update[1]:
        return None
    if None in first.grads or len(first.grads) != len(second.grads):
        return None
    made = events[first.start[0] : first.update[0]]
    if sorted(made) != sorted(first.grads):
        return None  # the first update's gradients are not all that was made for it
    renamed = dict(zip(second.grads, first.grads, strict=True))
    if None in renamed or any(log.raw_sizes[a] != log.raw_sizes[b] for a, b in renamed.items()):
        return None
    copied = [*events[start:update], *events[updated:end]]
    copied_allocated = {e for e in copied if e >= 0}
    copied_freed = {~e for e in copied if e < 0}
    if copied_freed - copied_allocated or copied_freed & renamed.keys():
        return None  # the pass frees what it did not make, or a gradient before the update
    if copied_allocated - copied_freed != renamed.keys():
        # Something of the pass lives on into the update or beyond it (state its first call
        # makes, which a first pass would make and a second would not), or a gradient is missing.
        return None
    next_id = len(log.raw_sizes)
    for aid in sorted(copied_allocated - renamed.keys()):
        renamed[aid] = next_id
        next_id += 1
    raw_sizes = [*log.raw_sizes, *(0 for _ in range(next_id - len(log.raw_sizes)))]
    categories = [*log.categories, *raw_sizes[len(log.categories) :]]
    for old, new in renamed.items():
        if new >= len(log.raw_sizes):
            raw_sizes[new], categories[new] = log.raw_sizes[old], log.categories[old]

    def copy(lo: int, hi: int) -> list[int]:
        return [renamed[e] if e >= 0 else ~renamed[~e] for e in events[lo:hi]]

    # (first event of the part in the new log, its range in the recorded one)
    parts = [(0, first.start[0]), (start, update), (first.update[0], first.updated[0])]
    parts += [(updated, end), (start, len(events))]
    spliced: list[int] = []
    phase_changes: list[tuple[int, str]] = []
    for index, (lo, hi) in enumerate(parts):
        phase_changes += _phases(log, lo, hi, len(spliced), last=index == len(parts) - 1)
        spliced += copy(lo, hi) if index in (1, 3) else events[lo:hi]
    shift = len(spliced) - (len(events) - start) - start
    out = _numbered(raw_sizes, categories, spliced, phase_changes, log)
    return out, shift


def _phases(log: StepLog, lo: int, hi: int, at: int, last: bool) -> list[tuple[int, str]]:
    """The phase changes of events `lo`..`hi` of `log`, placed from event `at` on: the phase at
    `lo`, then each change within (and after the end, for the last part)."""
    changes = [(at, log.phase_at(lo))]
    for index, phase in log.phase_changes:
        if lo < index and (index < hi or last):
            changes.append((index - lo + at, phase))
    return changes


def _numbered(
    raw_sizes: Sequence[int],
    categories: Sequence[int],
    events: Sequence[int],
    phase_changes: Sequence[tuple[int, str]],
    log: StepLog,
) -> StepLog:
    """The log with ids numbered in allocation order, as a tracker numbers them, and its phase
    changes in their least form (compact_phases)."""
    order: dict[int, int] = {}
    for event in events:
        if event >= 0:
            order[event] = len(order)
    ids = list(order)
    return StepLog.counted(
        [raw_sizes[aid] for aid in ids],
        [categories[aid] for aid in ids],
        [order[e] if e >= 0 else ~order[~e] for e in events],
        compact_phases(phase_changes),
        log.host_raw_sizes, log.host_pinned, log.host_events, log.host_event_phases,
    )  # fmt: skip


def compact_phases(changes: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
    """Phase changes in their least form, which says the same phase for every event: of the
    changes at one event, the last; and only changes to a phase other than the current one."""
    out: list[tuple[int, str]] = [(0, "setup")]
    for index, phase in changes:
        if out and out[-1][0] == index and len(out) > 1:
            out.pop()
        if out[-1][1] != phase:
            out.append((index, phase))
    return out
