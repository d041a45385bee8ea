"""The fork server behind `ForkServer` (autofit/probe/launcher.py).

`python -m autofit.probe.forkserver [--leave-out=LIBRARY...] MODULE...` marks the libraries
absent (autofit/probe/libraries.py), imports the modules, then reads one JSON request per line on
stdin and answers on stdout:

- `{"id", "module", "args", "log", "env", "timeout_s"}`: fork a child that runs
  `python -m <module> <args>` in a session of its own, tied to this server and to its deadline
  (autofit/probe/tether.py), with its output in `log`; answer `{"id", "pid"}` and, once the child
  is reaped, `{"id", "returncode"}`.
- `{"kill": id}`: kill that child's process group. The server does it, not the parent, because
  the server reaps its children: until it does, the child's pid, and so its group's id, cannot
  be reused, so the kill cannot reach another process.

When its input ends (the search closed it, or died) or its parent dies, it kills every child it
still runs, reaps them, and exits: a server never outlives the search that started it.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import runpy
import selectors
import signal
import sys
import threading
import traceback
from typing import Any

from autofit.probe.tether import tie

POLL_S = 0.05  # how often the server reaps children and checks its parent
# An argument that names a library to leave out rather than a module to import.
LEAVE_OUT = "--leave-out="


def _child(request: dict[str, Any], server: int) -> None:
    """In the forked child: a session of its own, tied to the server and its deadline, output to
    the log; then run the module. Never returns: whatever happens, the child exits here."""
    code = 1
    try:
        os.setsid()
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        # Over the server's request and reply pipes, which the child must not hold open.
        os.dup2(devnull, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(devnull)
        tie(server, request.get("timeout_s"))
        os.environ.update(request.get("env", {}))
        sys.argv = [request["module"], *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _kill(pid: int) -> None:
    """Kill a child that is not reaped yet and everything in its group. The child first: once it
    has the signal it starts nothing more (a fork it is in the middle of fails); then the group,
    which exists only if the child got as far as its setsid."""
    for kill, target in ((os.kill, pid), (os.killpg, pid)):
        try:
            kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _import_watching_parent(preload: list[str], parent: int) -> None:
    """Import the modules (seconds: torch), exiting at once if the parent dies meanwhile; the
    serving loop, which checks it too, cannot run until the imports are done."""

    done = threading.Event()

    def watch() -> None:
        while not done.wait(POLL_S):
            if os.getppid() != parent:
                os._exit(1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        # Libraries no probe of the search uses, as a fresh probe leaves them out
        # (autofit/probe/libraries.py): absent before anything imports them.
        for name in preload:
            if name.startswith(LEAVE_OUT):
                sys.modules[name.removeprefix(LEAVE_OUT)] = None  # type: ignore[assignment]
        for module in preload:
            if not module.startswith(LEAVE_OUT):
                importlib.import_module(module)
    finally:
        done.set()
        watcher.join()  # one thread again before the first fork


def _serve(preload: list[str]) -> None:

    parent, server = os.getppid(), os.getpid()
    _import_watching_parent(preload, parent)
    # What was imported lives as long as the server: out of the collector's sight, so that no
    # child's collection walks it again (or copies its pages to mark them): 0.76 s of a scan's
    # 10.9 s of CPU (benchmarks/forked_scan.py).
    gc.freeze()
    requests, replies = sys.stdin.fileno(), sys.stdout.buffer
    running: dict[int, int] = {}  # pid -> request id
    pids: dict[int, int] = {}  # request id -> pid, while running

    gone = False  # the parent closed its end of the replies: it is dead

    def reply(message: dict[str, Any]) -> None:
        nonlocal gone
        try:
            replies.write((json.dumps(message) + "\n").encode())
            replies.flush()
        except BrokenPipeError:
            gone = True

    def reap(block: bool = False) -> None:
        for pid in list(running):
            done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
            if done:
                pids.pop(running[pid], None)
                reply({"id": running.pop(pid), "returncode": os.waitstatus_to_exitcode(status)})

    def handle(request: dict[str, Any]) -> None:
        if "kill" in request:
            pid = pids.get(request["kill"])
            if pid is not None:  # else already reaped: its exit code is on its way
                _kill(pid)
            return
        pid = os.fork()
        if pid == 0:
            _child(request, server)
        running[pid] = request["id"]
        pids[request["id"]] = pid
        reply({"id": request["id"], "pid": pid})

    # Unbuffered reads: a buffered reader could swallow a second request the selector then
    # never reports.
    selector = selectors.DefaultSelector()
    selector.register(requests, selectors.EVENT_READ)
    pending = b""
    while True:
        if selector.select(timeout=POLL_S):
            data = os.read(requests, 1 << 16)
            if not data:
                break
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                handle(json.loads(line))
        reap()
        if gone or os.getppid() != parent:
            break
    # The search closed our input or died: nothing we still run has anyone to report to.
    for pid in running:
        _kill(pid)
    reap(block=True)
    # Exit at once: the interpreter's teardown with torch loaded takes a second or more, which a
    # search that is being interrupted would wait for.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    _serve(sys.argv[1:])
