"""A configuration's setup and updates, traced once for the scans of one search.

A scan assembles a structure that differs from its group's first only in its update (the
optimizer, an EMA copy) from the first's pass and its own setup and updates, traced alone
(`traced_updates` below). Those do not depend on knobs that change nothing
but the pass (checkpointing, the resolution, the attention kernel: `Knob.only_in_the_pass`), so
a search that scans AdamW 8-bit at two resolutions, with and without checkpointing, needs its
setup and updates once, not four times: `SharedUpdates` keeps each, keyed by the configuration
less those knobs, in a directory its scans share (one per search, in subprocesses that may run
at once). Whether a trace comes from there or is traced here, the log assembled from it is the
same (tests/test_shared_updates.py).
"""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import dataclass
from pathlib import Path

from autofit.backends.simulate import trace_run
from autofit.fastpath.first_step import Pass, assemble
from autofit.fastpath.update_keys import updates_key
from autofit.paths import write_atomically
from autofit.records.probe import ProbeSpec
from autofit.simulator.roofline import Kernel, RooflineCounter, Traffic, price
from autofit.simulator.step_log import StepLog, StepMarks


@dataclass(frozen=True)
class Updates:
    """A run's setup, its two updates from gradients made directly and what ran after them,
    traced with its pass left out (`traced_updates`): what `composed_steps` joins to a pass of
    the same forward and backward. Plain data, so a search's scans can share it
    (below: `SharedUpdates`)."""

    log: StepLog
    first: StepMarks
    second: StepMarks
    kernels: tuple[Kernel, ...]  # the second update's, priced
    traffic: Traffic
    counts: tuple[int, int]  # parameters, trainable parameters


def traced_updates(spec: ProbeSpec) -> Updates | None:
    """The run's setup and updates traced alone; None where its updates cannot run without a
    pass (TrainingRun.can_update_without_a_pass)."""
    roofline = RooflineCounter(spec.gpu_spec, keep_kernels=True)
    run, tracker, marks = trace_run(spec, roofline, alone=2)
    if marks is None:
        return None
    assert roofline.kernels is not None and roofline.traffic is not None
    plain = StepLog.counted(
        tracker.raw_sizes, tracker.categories, tracker.events, tracker.phase_changes,
        tracker.host_raw_sizes, tracker.host_pinned, tracker.host_events,
        tracker.host_event_phases, tracker.streams,
    )  # fmt: skip
    counts = (run.param_count, run.trainable_param_count)
    return Updates(plain, *marks, tuple(roofline.kernels), roofline.traffic, counts)


def composed_steps(updates: Updates, pass_: Pass, roofline: RooflineCounter) -> StepLog | None:
    """The log of two full steps with `pass_` as their pass (that of a structure with the same
    forward and backward: one that differs only in knobs whose `reach` is "outside_pass") and
    `updates`' setup and updates (fastpath/first_step.py); `roofline`, which must keep its
    kernels, then holds the step's price, from the pass's kernels and the update's. None where
    the gradients the updates were given are not the pass's."""
    assert roofline.kernels is not None, "the roofline must keep its kernels"
    assert pass_.priced, "the pass must have been priced with its kernels kept"
    steps = assemble(updates.log, updates.first, updates.second, pass_, updates.kernels)
    if steps is None:
        return None
    link, peer, host_compute = pass_.moved  # what the pass moves, and the update
    traffic = dataclasses.replace(
        updates.traffic,
        link_bytes=updates.traffic.link_bytes + link,
        peer_bytes=updates.traffic.peer_bytes + peer,
        host_compute_bytes=updates.traffic.host_compute_bytes + host_compute,
    )
    roofline.kernels[:] = steps.kernels
    roofline.traffic = traffic
    roofline.cost = price(roofline.gpu, steps.kernels, steps.ops, traffic)
    return steps.log


class SharedUpdates:
    """Setup-and-update traces by `updates_key`, in `root` (None: kept nowhere, each traced)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self.traced = self.reused = 0

    def updates(self, spec: ProbeSpec) -> Updates | None:
        """`spec`'s setup and updates: kept ones where another scan of the search traced them,
        else traced now (and kept). None where its updates cannot run without a pass."""
        path = self.root / f"{updates_key(spec)}.pickle" if self.root else None
        if path is not None and path.exists():
            self.reused += 1
            return pickle.loads(path.read_bytes())
        updates = traced_updates(spec)
        self.traced += 1
        if path is not None and updates is not None:
            write_atomically(path, pickle.dumps(updates))
        return updates
