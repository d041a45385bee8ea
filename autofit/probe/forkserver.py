"""The fork server behind `ForkServer` (autofit/probe/launcher.py).

`python -m autofit.probe.forkserver MODULE...` imports the modules, then reads one JSON request
per line on stdin (`id`, `module`, `args`, `log`, `env`), forks a child for each that runs
`python -m <module> <args>` in a session of its own with its output in `log`, and answers on
stdout with the child's pid and, once reaped, its exit code. It exits when stdin closes and its
children are done.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import traceback
from typing import Any


def _child(request: dict[str, Any]) -> None:
    """In the forked child: become a session of its own, write to the log, run the module."""
    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    devnull = os.open(os.devnull, os.O_RDONLY)
    # Over the server's request and reply pipes, which the child must not hold open.
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(devnull)
    os.environ.update(request.get("env", {}))
    code = 0
    try:
        sys.argv = [request["module"], *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _serve(preload: list[str]) -> None:
    import importlib
    import selectors

    for module in preload:
        importlib.import_module(module)
    requests, replies = sys.stdin.fileno(), sys.stdout.buffer
    running: dict[int, int] = {}  # pid -> request id

    def reply(message: dict[str, Any]) -> None:
        replies.write((json.dumps(message) + "\n").encode())
        replies.flush()

    def reap() -> None:
        for pid in list(running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                reply({"id": running.pop(pid), "returncode": os.waitstatus_to_exitcode(status)})

    def fork(request: dict[str, Any]) -> None:
        pid = os.fork()
        if pid == 0:
            _child(request)
        running[pid] = request["id"]
        reply({"id": request["id"], "pid": pid})

    # Unbuffered reads: a buffered reader could swallow a second request the selector then
    # never reports.
    selector = selectors.DefaultSelector()
    selector.register(requests, selectors.EVENT_READ)
    pending = b""
    open_input = True
    while open_input or running:
        if open_input and selector.select(timeout=0.05):
            data = os.read(requests, 1 << 16)
            if not data:
                open_input = False
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                fork(json.loads(line))
        elif not open_input:
            threading.Event().wait(0.05)
        reap()


if __name__ == "__main__":
    _serve(sys.argv[1:])
