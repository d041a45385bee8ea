"""The up-front check of `model=custom`: the user's entry function called once, on the meta
device, in a child process forked for it, under the command's `timeout_s`.

The user's code runs there, not in autofit: however it ends (returns something else than a
`CustomModel`, raises, calls os._exit or sys.exit, is killed by a signal, never returns),
autofit hears it and says it in one line naming `model.entry`, before any probe. The child is
forked, not started afresh: it has torch imported already, so checking a small model costs
milliseconds where a new interpreter would spend seconds importing torch again.

The bound is the command's `timeout_s`, the one each probe gets: a probe builds the same model
(for real, then trains it), so a build that cannot end within it could not be probed either,
and a user who raised `timeout_s` for a slow build is not refused by a tighter bound of
autofit's own.

The child leads a session of its own, so that whatever it starts ends with it; it dies with
autofit (autofit/probe/tether.py `die_with_parent`); its output goes nowhere, as the check's
answer is the one line.
"""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
from typing import Any, NoReturn

from autofit.errors import ConfigError
from autofit.probe.tether import die_with_parent
from autofit.workloads.custom import check_built, load_entry

POLL_S = 0.005  # how often the parent looks for the child's exit while it waits

_checked: set[str] = set()  # entries that passed, in this process
_lock = threading.Lock()  # a search's workers ask at once: one check, the others wait for it


def check_entry_builds(entry: Any, timeout_s: float) -> None:
    """A one-line ConfigError unless the user's function named by `entry` returns a
    CustomModel within `timeout_s` seconds. Once per entry and process."""
    with _lock:
        if str(entry) in _checked:
            return
        problem = _check_in_child(entry, timeout_s)
        if problem:
            raise ConfigError(problem)
        _checked.add(str(entry))


def _check_in_child(entry: Any, timeout_s: float) -> str | None:
    """What went wrong, in a line, or None."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _child(entry, write, os.getppid())
    os.close(write)
    try:
        messages, ending = _wait(pid, read, timeout_s)
    finally:
        os.close(read)
        _end(pid)
    doing = f"importing '{str(entry).partition(':')[0]}'"  # until the child says otherwise
    for message in messages:
        if "problem" in message:
            return message["problem"]
        doing = message.get("doing", doing)
    if ending is None:
        return (
            f"model.entry={entry}: {doing} did not return within timeout_s={timeout_s:g} s (it "
            "runs on the meta device, where nothing is allocated: seconds for any model); raise "
            "timeout_s= if it needs longer"
        )
    ended = next((m["ended"] for m in messages if "ended" in m), ending)
    return f"model.entry={entry}: {doing} {ended} instead of returning a CustomModel"


def _child(entry: Any, write: int, parent: int) -> NoReturn:
    """In the forked child: check the entry, write what happened as JSON lines, exit."""

    def say(message: dict[str, Any]) -> None:
        os.write(write, (json.dumps(message) + "\n").encode())

    try:
        os.setsid()
        die_with_parent(parent)
        quiet = os.open(os.devnull, os.O_RDWR)
        for stream in (0, 1, 2):
            os.dup2(quiet, stream)
        function = load_entry(entry)
        say({"doing": f"{str(entry).partition(':')[2]}()"})
        check_built(entry, function)
        say({"problem": None})
    except ConfigError as exc:  # the check's own one-line answer
        say({"problem": str(exc)})
    except SystemExit as exc:
        code = "" if exc.code is None else repr(exc.code)
        say({"ended": f"called sys.exit({code})"})
    except BaseException as exc:  # what `check_built` does not catch: KeyboardInterrupt and kin
        say({"ended": f"raised {type(exc).__name__}"})
    finally:
        os._exit(0)


def _wait(pid: int, read: int, timeout_s: float) -> tuple[list[dict[str, Any]], str | None]:
    """The child's messages and how it ended, or None for an ending if it ran past `timeout_s`.
    Its exit is watched, not the end of the pipe: anything it started may hold the pipe open.
    The child is left unreaped (WNOWAIT), so that its pid, and its group's, stays its own until
    `_end` has killed the group."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while True:
        exited = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        left = deadline - time.monotonic()
        if exited is not None or left <= 0:
            break
        if select.select([read], [], [], min(left, POLL_S))[0]:
            chunk = os.read(read, 1 << 16)
            data += chunk
            if not chunk:  # the child is ending: its exit is a moment away
                time.sleep(POLL_S)
    while select.select([read], [], [], 0)[0]:
        chunk = os.read(read, 1 << 16)
        if not chunk:
            break
        data += chunk
    return _messages(data), None if exited is None else _ending(exited)


def _messages(data: bytes) -> list[dict[str, Any]]:
    """The child's JSON lines; a line cut short by its death (or anything else on the pipe) is
    no message."""
    messages = []
    for line in data.decode(errors="replace").splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict):
            messages.append(message)
    return messages


def _ending(exited: Any) -> str:
    """How the child ended, from waitid's answer, in words."""
    if exited.si_code == os.CLD_EXITED:
        status = exited.si_status
        return f"ended its process with exit status {status} (as os._exit({status}) does)"
    try:
        name = signal.Signals(exited.si_status).name
    except ValueError:  # a real-time signal: a number only
        name = f"signal {exited.si_status}"
    oom = " (the kernel's out-of-memory killer sends it)" if name == "SIGKILL" else ""
    return f"was killed by {name}{oom}"


def _end(pid: int) -> None:
    """Kill the child and everything in its session's group, then reap it: a child that already
    exited leaves what it started, and one that ran past its time is stopped here."""
    for kill, target in ((os.kill, pid), (os.killpg, pid)):
        try:
            kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.waitpid(pid, 0)
