"""What ties a probe's process to its parent and to its deadline, however the parent ends.

A probe worker runs in a session of its own (so that a timeout can kill its whole process group),
which also puts it out of reach of every signal sent to the search's process group: a SIGKILL of
the search, or a scheduler's SIGTERM, would leave it running. So each worker, spawned or forked,
ties itself down before it runs anything:

- it dies with its parent: Linux's prctl(PR_SET_PDEATHSIG, SIGKILL) (man 2 prctl), then a check
  that the parent did not die before the call (the signal is only for a later death);
- a watchdog process in its group (forked before the probe starts, so it needs no GIL the probe
  could hold) kills the whole group when the worker exits, however, and at `timeout_s` plus
  GRACE_S from the start, should the parent not have done so by then.

`python -m autofit.probe.tether PARENT TIMEOUT_S MODULE ARGS...` ties itself down, then becomes
`python -m MODULE ARGS...` (exec: the same pid, group and tether). The fork server calls `tie`
in each forked child instead.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import sys
import time

# The parent kills a probe at its timeout; the worker's own deadline is a backstop for a parent
# that cannot (dead, stopped, wedged), a little later so the parent's kill, which reports the
# timeout, normally comes first.
GRACE_S = 2.0
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
WATCH_PERIOD_S = 0.2  # how often the watchdog checks that the worker is still its parent


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when `parent` (the process that started it) dies; exit now if it
    already has. Without prctl (not Linux), the deadline alone bounds an orphan."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # died before the prctl: no signal will ever come
        os._exit(1)


def _watch(done: int, worker: int, deadline: float, log: int) -> None:
    """The watchdog's life: wait for the worker to exit (its end of the pipe closes, or this
    process is reparented) or for the deadline; then end the group. Never returns."""
    try:
        while True:
            left = deadline - time.time()
            if left <= 0:
                os.write(
                    log,
                    b"\nautofit: the probe ran past its timeout_s and its parent did not end it; "
                    b"the probe's watchdog ends its process group\n",
                )
                break
            ready, _, _ = select.select([done], [], [], min(left, WATCH_PERIOD_S))
            if ready or os.getppid() != worker:
                break  # the worker is gone: end whatever it left behind in its group
        if os.getpgrp() == worker:
            os.killpg(worker, signal.SIGKILL)  # this watchdog included
        else:
            os.kill(worker, signal.SIGKILL)  # never a group the worker does not lead
    finally:
        os._exit(0)


def watch_group(timeout_s: float | None) -> None:
    """Fork the watchdog of this process's group (see the module's docstring). The worker keeps
    the write end of a pipe, inheritable so that it survives exec; its exit closes it."""
    done, keep = os.pipe()
    os.set_inheritable(keep, True)
    deadline = time.time() + (timeout_s + GRACE_S if timeout_s is not None else float("inf"))
    worker = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(keep)
        _watch(done, worker, deadline, sys.stderr.fileno())
    os.close(done)


def tie(parent: int, timeout_s: float | None) -> None:
    """Both ties, for a process that already leads its own session."""
    die_with_parent(parent)
    watch_group(timeout_s)


def main(argv: list[str]) -> None:
    parent, timeout, module, *args = argv
    tie(int(parent), float(timeout) if timeout != "none" else None)
    os.execv(sys.executable, [sys.executable, "-m", module, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
