"""Claims: how several workers on one study split its probes instead of each running all of them.

A worker claims a probe in the study before running it: a RUNNING Optuna trial whose user
attribute `key` is the probe's key (`kind` is `claim` until it finishes), whose system attributes
name the worker (`autofit:worker`) and carry its heartbeat (`autofit:heartbeat`, rewritten by a
thread every quarter of the grace period while the probe runs). The finished probe is written
into that same trial (the user attributes a recorded probe has, then COMPLETE or FAIL), so each
probe is one trial however many workers wanted it.

Two workers that claim one probe at once: the claim with the lower trial id wins, and the other
ends its own trial as PRUNED (`autofit:claim` = `lost`). That is decided without a lock of our
own because Optuna creates a trial holding its study's row lock until it commits (RDBStorage:
`_create_new_trial`, SELECT ... FOR UPDATE; SQLite has one writer at a time; a journal is one
ordered log), so trial ids grow in commit order: a worker that reads the study after its claim is
stored sees every lower claim, and exactly one claim finds none below it.

A claim is stale, and taken over (ended as PRUNED, then claimed anew), when its heartbeat has not
changed for the grace period as this worker's own clock measures it (no two machines' clocks are
compared), when it has been running longer than its probe's timeout plus the grace period (a
worker alive but stuck), or at once when its worker was a process on this machine that has
exited (a search killed and started again does not wait). A PRUNED trial is never a probe's
answer, so a worker taken over while still alive cannot record its result: Optuna refuses to
change a finished trial's state, and that refusal tells it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autofit.search.retry import last_outage_end

WORKER_ATTR = "autofit:worker"
HEARTBEAT_ATTR = "autofit:heartbeat"
TIMEOUT_ATTR = "autofit:timeout_s"
CLAIM_ATTR = "autofit:claim"  # why a claim ended without a result: lost, released, taken_over

# How often a worker waiting on another's probe looks at the study again: a read of the trials
# that changed, cheap next to any probe.
POLL_S = 0.5


class Busy(Exception):
    """The probe is claimed by a live worker: do something else and ask again later."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks after boot; Linux), which tells a process from a
    later one that reuses its id; None where /proc does not say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name, in parentheses, may hold spaces: the fields after it are plain.
    return int(stat.rsplit(")", 1)[1].split()[19])


def this_worker() -> dict[str, Any]:
    """This process, as its claims name it (computed per call: a forked child is another)."""
    pid = os.getpid()
    return {
        "host": socket.gethostname(),
        "boot": _boot_id(),
        "pid": pid,
        "start": _start_ticks(pid),
    }


def exited(worker: Any) -> bool:
    """Whether the worker a claim names was a process on this machine (same host name and
    boot) that is no longer running. A worker elsewhere is never judged here: its heartbeat is."""
    if not isinstance(worker, dict) or not isinstance(worker.get("pid"), int):
        return False
    here = this_worker()
    if (worker.get("host"), worker.get("boot")) != (here["host"], here["boot"]):
        return False
    pid = worker["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # someone else's process: alive
        pass
    started = worker.get("start")
    return started is not None and _start_ticks(pid) not in (None, started)


class Liveness:
    """Judges other workers' claims by watching their heartbeats with this process's clock."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self._seen: dict[int, tuple[Any, float, float]] = {}  # trial id -> beat, first, changed
        self._lock = threading.Lock()

    def lapsed(self, trial_id: int, system_attrs: dict[str, Any]) -> str | None:
        """Why the claim in trial `trial_id` is stale, or None while its worker looks alive."""
        if exited(system_attrs.get(WORKER_ATTR)):
            return "its worker process has exited"
        now = time.monotonic()
        beat = system_attrs.get(HEARTBEAT_ATTR)
        with self._lock:
            last, first, changed = self._seen.get(trial_id, (beat, now, now))
            if beat != last:
                changed = now
            # While this worker could not reach the storage it saw no beat: not the claim's
            # worker's fault (it may have been cut off as well).
            changed = max(changed, last_outage_end())
            self._seen[trial_id] = (beat, first, changed)
        if now - changed > self.grace_s:
            return f"no heartbeat for {now - changed:.0f} s"
        timeout = system_attrs.get(TIMEOUT_ATTR)
        if isinstance(timeout, (int, float)) and now - first > timeout + self.grace_s:
            return f"running for {now - first:.0f} s, past its timeout_s={timeout:g}"
        return None


class Heartbeat:
    """A daemon thread that calls `beat(trial_id)` for every held claim every `interval_s`."""

    def __init__(self, beat: Callable[[int], None], interval_s: float) -> None:
        self._beat, self.interval_s = beat, interval_s
        self._held: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, trial_id: int) -> None:
        with self._lock:
            self._held.add(trial_id)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="autofit-heartbeat", daemon=True
                )
                self._thread.start()

    def drop(self, trial_id: int) -> None:
        with self._lock:
            self._held.discard(trial_id)

    def held(self) -> list[int]:
        with self._lock:
            return sorted(self._held)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:  # a daemon: one blocked in a storage call is left behind
            self._thread.join(timeout=0.5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for trial_id in self.held():
                try:
                    self._beat(trial_id)
                except Exception:  # a missed beat is retried at the next; the grace allows four
                    pass
