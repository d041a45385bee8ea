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
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Protocol, TypeVar

from autofit.errors import ProbeNotFinished
from autofit.families import REGISTRY
from autofit.probe.forkserver import LEAVE_OUT
from autofit.probe.libraries import OPTIONAL

log = logging.getLogger(__name__)

# Every wait on a process that was sent SIGKILL, or on a server asked to send it, is bounded: a
# wait that never ends is the one failure a timeout must not have. A SIGKILLed process is gone in
# milliseconds; these leave room for a loaded machine.
KILL_WAIT_S = 5.0
STOP_WAIT_S = 1.0  # on an interrupt, for the fork server to end its children and exit
SERVER_START_S = 120.0  # for a fresh fork server's imports, before a kill gives up on it


class ServerDied(ProbeNotFinished):
    """The fork server died under a running probe: the probe's fate is unknown, and it is worth
    one more try on a fresh server."""


class WorkerProcess(Protocol):
    def wait(self, timeout: float) -> int | None:
        """The exit code (negative: killed by that signal), or None if still running. Raises
        ProbeNotFinished if the launcher was stopped under it, ServerDied if its server died."""

    def kill_group(self) -> None:
        """Kill the worker and every process in its group, and reap it (bounded)."""


class Launcher(Protocol):
    def start(
        self,
        module: str,
        args: list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> WorkerProcess:
        """Run `python -m <module> <args>`, output to `log_path`, with `env` added to the
        environment before the interpreter (and so torch) starts. The process dies with its
        parent and kills its own group `timeout_s` (plus a grace) after it starts
        (autofit/probe/tether.py). Raises ProbeNotFinished once the launcher is stopped."""

    def stop(self, reason: str) -> None:
        """Kill every worker still running; their `wait` and every later `start` raise
        ProbeNotFinished(reason). For an interrupted search: it returns within seconds."""

    def close(self) -> None: ...

    def warm(self) -> None:
        """Get ready for the first `start` now, while the caller does something else (a fork
        server's imports); nothing for a launcher that starts each worker fresh."""


def _timeout_word(timeout_s: float | None) -> str:
    return "none" if timeout_s is None else repr(float(timeout_s))


class _Spawned:
    def __init__(self, proc: subprocess.Popen[bytes], launcher: SpawnLauncher) -> None:
        self._proc = proc
        self._launcher = launcher
        self.stopped: str | None = None  # why the launcher killed it, if it did

    def wait(self, timeout: float) -> int | None:
        try:
            code = self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self._launcher._forget(self)
        if self.stopped:
            raise ProbeNotFinished(self.stopped)
        return code

    def kill(self) -> None:
        # Not reaped yet (returncode is None): the pid, and its group's id, are still this
        # worker's. Reaping happens only in wait().
        if self._proc.returncode is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def kill_group(self) -> None:
        self.kill()
        try:
            self._proc.wait(timeout=KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            log.warning(
                "probe worker %d did not exit %g s after SIGKILL", self._proc.pid, KILL_WAIT_S
            )
        self._launcher._forget(self)


_Context = TypeVar("_Context", bound="_StopsOnError")


class _StopsOnError:
    """A launcher as a context: leaving it on an error (an interrupt included) stops every worker
    still running before closing, so none outlives the search."""

    def stop(self, reason: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Context) -> _Context:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is not None:
            self.stop("the search stopped before this probe finished")
        self.close()


class SpawnLauncher(_StopsOnError):
    """`python -m <module> <args>` in a new session, output to `log_path`, tethered
    (autofit/probe/tether.py) to this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[_Spawned] = set()
        self._stopped: str | None = None

    def close(self) -> None:
        pass

    def warm(self) -> None:
        pass  # each worker is a fresh interpreter: nothing to start ahead

    def stop(self, reason: str) -> None:
        with self._lock:
            self._stopped = reason
            running = list(self._running)
            for spawned in running:
                spawned.stopped = reason
        for spawned in running:
            spawned.kill()

    def _forget(self, spawned: _Spawned) -> None:
        with self._lock:
            self._running.discard(spawned)

    def start(
        self,
        module: str,
        args: list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> WorkerProcess:
        # The tether's death signal is bound to the thread that forks it (man 2 prctl): this one,
        # which waits in run_probe for the worker, so it outlives it.
        command = [sys.executable, "-m", "autofit.probe.tether", str(os.getpid()),
                   _timeout_word(timeout_s), module, *args]  # fmt: skip
        with self._lock, open(log_path, "wb") as log_file:
            if self._stopped:  # under the lock: a stop either sees this worker or forbids it
                raise ProbeNotFinished(self._stopped)
            proc = subprocess.Popen(
                command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **env} if env else None,
            )
            spawned = _Spawned(proc, self)
            self._running.add(spawned)
        return spawned


class _Forked:
    def __init__(
        self, server: ForkServer, server_proc: subprocess.Popen[bytes], request: int
    ) -> None:
        self._server = server
        self._server_proc = server_proc  # the fork server this request was written to
        self._request = request
        self.pid: int | None = None
        self.returncode: int | None = None
        self.lost: ProbeNotFinished | None = None  # why it ended without an exit code
        self.exited = threading.Event()

    def wait(self, timeout: float) -> int | None:
        if not self.exited.wait(timeout):
            return None
        if self.lost is not None:
            raise self.lost
        return self.returncode

    def kill_group(self) -> None:
        """Ask the server, which reaps this worker and so knows its pid is still its, to kill the
        worker's group; if no exit is reported within KILL_WAIT_S, the server is hung: kill it
        (and the worker by pid) and give up on what it runs."""
        self._server._send(self._server_proc, {"kill": self._request})
        if self.exited.wait(KILL_WAIT_S):
            return
        if self.pid is None and self._server_proc.poll() is None:
            # Not forked yet: the server is still importing (a fresh one, on a loaded machine,
            # can take longer than the timeout). It forks the child and then reads the kill.
            if self.exited.wait(SERVER_START_S):
                return
        self._server._abandon(self._server_proc, "the fork server did not answer a kill", True)


class ForkServer(_StopsOnError):
    """A process that has imported `preload` and forks a worker for each `start`.

    Thread-safe: a search starts probes from several threads. If the server dies, the probes it
    was running raise ServerDied and the next `start` brings up a new server.
    """

    def __init__(self, preload: list[str]) -> None:
        self._preload = preload
        self._lock = threading.Lock()
        self._pending: dict[int, _Forked] = {}
        self._next = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._stopped: str | None = None
        # Servers given up on. A server's replies end (its pipes close) a moment before it can
        # be reaped, and a retry comes in that moment: poll() alone would still call it alive.
        self._gone: set[int] = set()

    def _ensure_running(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.pid in self._gone or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "autofit.probe.forkserver", *self._preload],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,
            )
            threading.Thread(target=self._read, args=(self._proc,), daemon=True).start()
        return self._proc

    def warm(self) -> None:
        """Start the server now, so that its imports run while the caller does something else
        (`autofit probe` composes its configuration meanwhile)."""
        with self._lock:
            if not self._stopped:
                self._ensure_running()

    def discard(self) -> None:
        """Kill the server at once, whatever it is doing, and reap it: for a server warmed for a
        probe that turned out not to be its to run (a `cuda` probe, a configuration error). Unlike
        `stop`, no wait for a server busy importing to read that its input ended."""
        with self._lock:
            self._stopped = self._stopped or "the fork server was discarded"
            proc, self._proc = self._proc, None
        if proc is not None:
            self._abandon(proc, "the fork server was discarded")
            try:
                proc.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                log.warning("fork server %d did not exit after SIGKILL", proc.pid)

    def start(
        self,
        module: str,
        args: list[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> WorkerProcess:
        # The forked child sets `env` itself; the server has imported torch but never
        # initialised CUDA (it serves the CPU backends only), so nothing has read it yet.
        with self._lock:
            if self._stopped:
                raise ProbeNotFinished(self._stopped)
            proc = self._ensure_running()
            self._next += 1
            forked = _Forked(self, proc, self._next)
            self._pending[self._next] = forked
            request = {"id": self._next, "module": module, "args": args, "log": str(log_path),
                       "env": env or {}, "timeout_s": timeout_s}  # fmt: skip
            sent = self._write(proc, request)
        if not sent:  # outside the lock: _lose takes it
            self._lose(forked, ServerDied("the fork server died before the probe started"))
        return forked

    @staticmethod
    def _write(proc: subprocess.Popen[bytes], message: dict[str, Any]) -> bool:
        assert proc.stdin is not None
        try:
            proc.stdin.write((json.dumps(message) + "\n").encode())
            proc.stdin.flush()
            return True
        except (BrokenPipeError, ValueError):  # ValueError: closed by stop() meanwhile
            return False

    def _send(self, proc: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
        with self._lock:
            self._write(proc, message)

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                message = json.loads(line)
                with self._lock:
                    forked = self._pending.get(message["id"])
                if forked is None:
                    continue
                if "pid" in message:
                    forked.pid = message["pid"]
                else:
                    self._finish(forked, message["returncode"])
        except (ValueError, KeyError, TypeError):
            log.warning("the fork server wrote something that is not a reply; abandoning it")
            self._abandon(proc, "the fork server's replies could not be read")
        # This server is gone: whatever it was running will never report (requests already sent
        # to a newer server are not its).
        self._abandon(proc, "the fork server died while the probe ran")

    def _finish(self, forked: _Forked, returncode: int) -> None:
        forked.returncode = returncode  # after a stop, `lost` is set: wait() raises it
        with self._lock:
            self._pending.pop(forked._request, None)
        forked.exited.set()

    def _lose(self, forked: _Forked, why: ProbeNotFinished) -> None:
        forked.lost = forked.lost or why
        with self._lock:
            self._pending.pop(forked._request, None)
        forked.exited.set()

    def _abandon(self, proc: subprocess.Popen[bytes], why: str, hung: bool = False) -> None:
        """Give up on `proc`: kill it if alive, and its probes raise ServerDied (or, after a
        stop, ProbeNotFinished with the stop's reason). A `hung` server, alive but not answering,
        has not reaped its children, so their pids are still theirs: they are killed by pid
        first. (A dead server's children die with it: tether.py.)"""
        with self._lock:
            self._gone.add(proc.pid)
            orphans = [f for f in self._pending.values() if f._server_proc is proc]
            stopped = self._stopped
        if proc.poll() is None:
            for forked in orphans if hung else ():
                if forked.pid is not None:
                    for kill, target in ((os.kill, forked.pid), (os.killpg, forked.pid)):
                        try:
                            kill(target, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the server leads a session of its own
            except ProcessLookupError:
                pass
        for forked in orphans:
            self._lose(forked, ProbeNotFinished(stopped) if stopped else ServerDied(why))

    def _shut(self, proc: subprocess.Popen[bytes], wait_s: float) -> None:
        """End `proc`'s input, on which it kills what it still runs and exits; kill it if it has
        not within `wait_s`."""
        assert proc.stdin is not None
        with self._lock:
            try:
                proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self._abandon(proc, "the fork server did not exit when asked", True)
            try:
                proc.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                log.warning("fork server %d did not exit after SIGKILL", proc.pid)

    def stop(self, reason: str) -> None:
        with self._lock:
            self._stopped = reason
            proc = self._proc
            for forked in self._pending.values():  # what the server reports now is no answer
                forked.lost = ProbeNotFinished(reason)
        if proc is not None:
            self._shut(proc, STOP_WAIT_S)
            self._abandon(proc, reason)  # what it reported killed: not an answer

    def close(self) -> None:
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            self._shut(proc, 10)


def launcher_for(
    backend: str, family: str, uses: set[str] | None = None
) -> SpawnLauncher | ForkServer:
    """How a search starts its probes: forked from a server that has imported the backend and the
    model family's library, or (for `cuda`, whose forked context is unusable) spawned fresh.
    `uses`: the optional libraries its probes may import (autofit/probe/libraries.py
    `libraries_of`); the server leaves out the others, as a probe's own process does (a Sana
    search without LoRA: peft, 0.3 s of the server's 3.9 s of imports). None: all kept."""
    if backend == "cuda":
        return SpawnLauncher()
    preload = ["autofit.probe.worker", f"autofit.backends.{backend}", REGISTRY[family].workload]
    if uses is not None:
        preload = [f"{LEAVE_OUT}{name}" for name in OPTIONAL if name not in uses] + preload
    return ForkServer(preload=preload)
