"""How a probe's worker process is started: spawned fresh, or forked from a fork server.

Every probe runs in a process of its own that exits when the probe is done; that is what resets
allocator state, autocast caches and CUDA contexts between probes. A fresh interpreter spends about
five seconds importing torch and the model libraries before the probe starts, longer than a
simulated step takes. The fork server imports them once; each probe is then a child forked from
it, with its own session (process group), its own output file, and an exit that ends it. The fork
server never runs a probe itself and never initialises CUDA (a forked CUDA context is unusable),
so it is only for the CPU backends; `cuda` probes are spawned.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Protocol


class WorkerProcess(Protocol):
    def wait(self, timeout: float) -> int | None:
        """The exit code (negative: killed by that signal), or None if still running."""

    def kill_group(self) -> None:
        """Kill the worker and every process in its group, and reap it."""


class Launcher(Protocol):
    def start(
        self, module: str, args: list[str], log_path: Path, env: dict[str, str] | None = None
    ) -> WorkerProcess:
        """Run `python -m <module> <args>`, output to `log_path`, with `env` added to the
        environment before the interpreter (and so torch) starts."""

    def close(self) -> None: ...


class _Spawned:
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc

    def wait(self, timeout: float) -> int | None:
        try:
            return self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill_group(self) -> None:
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._proc.wait()


class SpawnLauncher:
    """`python -m <module> <args>` in a new session, output to `log_path`."""

    def close(self) -> None:
        pass

    def __enter__(self) -> SpawnLauncher:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def start(
        self, module: str, args: list[str], log_path: Path, env: dict[str, str] | None = None
    ) -> WorkerProcess:
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **env} if env else None,
            )
        return _Spawned(proc)


class _Forked:
    def __init__(self, server_proc: subprocess.Popen[bytes], request: int) -> None:
        self._server_proc = server_proc  # the fork server this request was written to
        self._request = request
        self.pid: int | None = None
        self.returncode: int | None = None
        self.started = threading.Event()
        self.exited = threading.Event()

    def wait(self, timeout: float) -> int | None:
        if not self.exited.wait(timeout):
            return None
        return self.returncode

    def kill_group(self) -> None:
        self.started.wait()
        if self.pid is not None and not self.exited.is_set():
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                # Forked but not yet in a session of its own (its first act): no group of that id
                # exists, and the child, which has started nothing yet, is killed alone. The server
                # has not reaped it, so the pid is still its.
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.exited.wait()


class ForkServer:
    """A process that has imported `preload` and forks a worker for each `start`.

    Thread-safe: a search starts probes from several threads. If the server dies, its running
    workers report a crash and the next `start` brings up a new server.
    """

    def __init__(self, preload: list[str]) -> None:
        self._preload = preload
        self._lock = threading.Lock()
        self._pending: dict[int, _Forked] = {}
        self._next = 0
        self._proc: subprocess.Popen[bytes] | None = None

    def _ensure_running(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "autofit.probe.forkserver", *self._preload],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,
            )
            threading.Thread(target=self._read, args=(self._proc,), daemon=True).start()
        return self._proc

    def start(
        self, module: str, args: list[str], log_path: Path, env: dict[str, str] | None = None
    ) -> WorkerProcess:
        # The forked child sets `env` itself; the server has imported torch but never
        # initialised CUDA (it serves the CPU backends only), so nothing has read it yet.
        with self._lock:
            proc = self._ensure_running()
            self._next += 1
            forked = _Forked(proc, self._next)
            self._pending[self._next] = forked
            request = {
                "id": self._next,
                "module": module,
                "args": args,
                "log": str(log_path),
                "env": env or {},
            }
            assert proc.stdin is not None
            try:
                proc.stdin.write((json.dumps(request) + "\n").encode())
                proc.stdin.flush()
                sent = True
            except BrokenPipeError:
                sent = False
        if not sent:  # outside the lock: _finish takes it
            self._finish(forked, None)
        return forked

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            message = json.loads(line)
            with self._lock:
                forked = self._pending.get(message["id"])
            if forked is None:
                continue
            if "pid" in message:
                forked.pid = message["pid"]
                forked.started.set()
            else:
                self._finish(forked, message["returncode"])
        # This server is gone: whatever it was running will never report (requests already sent
        # to a newer server are not its).
        with self._lock:
            orphans = [f for f in self._pending.values() if f._server_proc is proc]
        for forked in orphans:
            self._finish(forked, None)

    def _finish(self, forked: _Forked, returncode: int | None) -> None:
        forked.returncode = -signal.SIGKILL if returncode is None else returncode
        forked.started.set()
        forked.exited.set()
        with self._lock:
            self._pending.pop(forked._request, None)

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()  # the server exits when its input ends
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def launcher_for(backend: str, family: str) -> SpawnLauncher | ForkServer:
    """How a search starts its probes: forked from a server that has imported the backend and the
    model family's library, or (for `cuda`, whose forked context is unusable) spawned fresh."""
    if backend == "cuda":
        return SpawnLauncher()
    from autofit.workloads import FAMILIES

    return ForkServer(
        preload=["autofit.probe.worker", f"autofit.backends.{backend}", FAMILIES[family]]
    )
