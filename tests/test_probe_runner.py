"""The parent never raises because a child failed: each failure is an ordinary result."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import spec

from autofit.probe.launcher import ForkServer, Launcher, SpawnLauncher
from autofit.probe.runner import run_probe
from autofit.records.probe import Outcome, ProbeResult

TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def workers_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(TESTS))


@pytest.fixture(params=["spawn", "forkserver"])
def launcher(request: pytest.FixtureRequest, workers_importable: None) -> Iterator[Launcher]:
    """Every failure mode holds whether the worker is spawned or forked from the fork server."""
    if request.param == "spawn":
        yield SpawnLauncher()
    else:
        with ForkServer(preload=["autofit.probe.worker"]) as server:
            yield server


def _dead(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    if not status.exists():
        return True
    return "\nState:\tZ" in status.read_text()  # a zombie has exited; only its entry remains


@pytest.mark.long
def test_timeout_kills_the_whole_process_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: Launcher
) -> None:
    pidfile = tmp_path / "grandchild.pid"
    monkeypatch.setenv("AUTOFIT_TEST_PIDFILE", str(pidfile))
    probe = dataclasses.replace(spec("tiny_mlp"), timeout_s=3.0)
    # The fork server imports torch before its first fork; on a loaded machine that alone can
    # outlast the 3-second timeout, and the worker would never start. Warm it first.
    run_probe(probe, worker="workers.die", launcher=launcher)
    started = time.perf_counter()
    result = run_probe(probe, worker="workers.hang", launcher=launcher)
    assert result.outcome is Outcome.TIMEOUT
    assert time.perf_counter() - started < 30
    assert "timeout_s=3" in result.error["message"]
    assert "worker hanging" in result.error["log_tail"]
    grandchild = int(pidfile.read_text())
    deadline = time.time() + 5
    while not _dead(grandchild) and time.time() < deadline:
        time.sleep(0.1)
    assert _dead(grandchild), "the worker's own child survived the timeout"


def _pids(pidfile: Path, count: int, within: float = 180) -> list[int]:
    deadline = time.time() + within
    while time.time() < deadline:
        if pidfile.exists() and len(words := pidfile.read_text().split()) == count:
            return [int(w) for w in words]
        time.sleep(0.05)
    raise AssertionError(f"{pidfile} never got its {count} pids")


def _all_dead(pids: list[int], within: float) -> bool:
    deadline = time.time() + within
    while not all(map(_dead, pids)) and time.time() < deadline:
        time.sleep(0.05)
    return all(map(_dead, pids))


def test_a_kill_sent_before_the_server_has_forked_the_worker_still_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The timeout can fire while a fresh server is still importing, before it has forked the
    # worker or before the worker's setsid (the suite once hung here, waiting for an exit nobody
    # caused). The kill goes to the server, behind the request: it forks, then kills the child
    # and its group, whichever state the child is in, and reports the exit.
    monkeypatch.setenv("AUTOFIT_TEST_PIDFILE", str(tmp_path / "grandchild.pid"))
    with ForkServer(preload=["autofit.probe.worker"]) as server:
        proc = server.start("workers.hang", [], tmp_path / "log", timeout_s=60)
        started = time.perf_counter()
        proc.kill_group()
        assert time.perf_counter() - started < 120
        assert proc.wait(timeout=0) == -9


@pytest.mark.long
def test_a_server_that_does_not_answer_a_kill_is_given_up_within_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signal

    from autofit.probe.launcher import KILL_WAIT_S, ServerDied

    pidfile = tmp_path / "pids"
    monkeypatch.setenv("AUTOFIT_TEST_PIDFILE", str(pidfile))
    with ForkServer(preload=["autofit.probe.worker"]) as server:
        proc = server.start("workers.hang_measure", [str(tmp_path / "spec"), "r"], tmp_path / "log")
        # (the real worker: a spec it cannot read ends it; give it one)
        (tmp_path / "spec").write_text(spec("tiny_mlp").to_json())
        worker, grandchild = _pids(pidfile, 2)
        assert server._proc is not None
        os.kill(server._proc.pid, signal.SIGSTOP)  # hung: it will not read the kill
        started = time.perf_counter()
        proc.kill_group()
        assert time.perf_counter() - started < KILL_WAIT_S + 5
        with pytest.raises(ServerDied):
            proc.wait(timeout=0)
        # killed by pid while the hung server could not reap it, then the server itself
        assert _all_dead([worker, grandchild, server._proc.pid], within=5)


def test_stopping_the_launcher_ends_a_running_probe_without_an_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: Launcher
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from autofit.errors import ProbeNotFinished

    pidfile = tmp_path / "pids"
    monkeypatch.setenv("AUTOFIT_TEST_PIDFILE", str(pidfile))
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(run_probe, spec("tiny_mlp"), "workers.hang_measure", None, launcher)
        pids = _pids(pidfile, 2)
        started = time.perf_counter()
        launcher.stop("interrupted by SIGTERM")
        with pytest.raises(ProbeNotFinished, match="interrupted by SIGTERM"):
            running.result(timeout=10)
        assert time.perf_counter() - started < 2
    assert _all_dead(pids, within=2)
    with pytest.raises(ProbeNotFinished):  # a queued probe never starts
        run_probe(spec("tiny_mlp"), worker="workers.die", launcher=launcher)


@pytest.mark.parametrize("deaths", [1, 2])
def test_a_probe_whose_fork_server_dies_is_retried_once_then_not_answered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, deaths: int
) -> None:
    import signal
    from concurrent.futures import ThreadPoolExecutor

    from autofit.errors import ProbeNotFinished

    pidfile = tmp_path / "pid"
    monkeypatch.setenv("AUTOFIT_TEST_FLAG", str(tmp_path / "flag"))
    monkeypatch.setenv("AUTOFIT_TEST_PIDFILE", str(pidfile))
    if deaths == 2:
        monkeypatch.setenv("AUTOFIT_TEST_ALWAYS", "1")  # the retry hangs too
    with ForkServer(preload=["autofit.probe.worker"]) as server, ThreadPoolExecutor(1) as pool:
        running = pool.submit(run_probe, spec("tiny_mlp"), "workers.hang_first", None, server)
        for _ in range(deaths):
            (worker,) = _pids(pidfile, 1)
            pidfile.unlink()
            assert server._proc is not None
            os.kill(server._proc.pid, signal.SIGKILL)
            # the hanging worker dies with its server (tether.py)
            assert _all_dead([worker], within=5)
        if deaths == 1:
            assert running.result(timeout=120).outcome is Outcome.OK
        else:
            with pytest.raises(ProbeNotFinished, match="fork server died"):
                running.result(timeout=120)


@pytest.mark.long
@pytest.mark.parametrize("kind", [pytest.param("spawn", marks=pytest.mark.slow), "forkserver"])
def test_a_worker_whose_parent_cannot_kill_it_ends_its_own_group_at_its_deadline(
    tmp_path: Path, kind: str
) -> None:
    # The parent is stopped (SIGSTOP) while its probe hangs: no kill comes at timeout_s, and no
    # death signal either. The worker's watchdog must end the worker and its child.
    import signal
    import subprocess
    import sys

    from autofit.probe.tether import GRACE_S

    pidfile = tmp_path / "pids"
    # A spawned worker imports torch inside its timeout: on a loaded machine, seconds. A forked
    # one starts at once from a server that a first probe has warmed.
    timeout_s = 20.0 if kind == "spawn" else 5.0
    code = (
        "import dataclasses, sys; sys.path.insert(0, sys.argv[1]); from helpers import spec; "
        "from autofit.probe.runner import run_probe; "
        "from autofit.probe.launcher import ForkServer, SpawnLauncher; "
        f"launcher = SpawnLauncher() if {kind!r} == 'spawn' else "
        "ForkServer(['autofit.probe.worker']); "
        f"probe = dataclasses.replace(spec('tiny_mlp'), timeout_s={timeout_s}); "
        "run_probe(probe, 'workers.die', launcher=launcher); "
        "run_probe(probe, 'workers.hang_measure', launcher=launcher)"
    )
    env = {**os.environ, "AUTOFIT_TEST_PIDFILE": str(pidfile)}
    parent = subprocess.Popen([sys.executable, "-c", code, str(TESTS)], env=env)
    try:
        pids = _pids(pidfile, 2, within=120)
        parent.send_signal(signal.SIGSTOP)
        started = time.time()
        assert _all_dead(pids, within=timeout_s + GRACE_S + 3)
        assert time.time() - started > 0.5  # ended by the deadline, not at once
    finally:
        parent.kill()
        parent.wait()


def test_a_worker_that_dies_is_a_crash_with_its_stderr_tail(launcher: Launcher) -> None:
    result = run_probe(spec("tiny_mlp"), worker="workers.die", launcher=launcher)
    assert result.outcome is Outcome.CRASH
    assert "exited with code 3" in result.error["message"]
    assert "about to die on purpose" in result.error["log_tail"]


def test_out_of_memory_is_recognised_by_exception_type(launcher: Launcher) -> None:
    result = run_probe(spec("tiny_mlp"), worker="workers.oom", launcher=launcher)
    assert result.outcome is Outcome.OOM
    assert "Tried to allocate 2.00 GiB" in result.error["message"]
    assert result.versions["torch"]


def test_any_other_exception_is_a_crash_with_its_traceback(launcher: Launcher) -> None:
    result = run_probe(spec("tiny_mlp"), worker="workers.error", launcher=launcher)
    assert result.outcome is Outcome.CRASH
    assert result.error["message"] == "ValueError: a bug in a backend"
    assert "Traceback" in result.error["log_tail"]


def test_invalid_is_decided_before_any_process_starts() -> None:
    result = run_probe(spec("tiny_mlp", gpu="t4", precision="bf16"), worker="workers.die")
    assert result.outcome is Outcome.INVALID
    assert "T4" in result.error["message"] and "fp16" in result.error["message"]


def test_results_round_trip_through_json(launcher: Launcher) -> None:
    result = run_probe(spec("tiny_mlp"), launcher=launcher)
    assert result.outcome is Outcome.OK
    again = ProbeResult.from_json(result.to_json())
    assert again == result


@pytest.mark.long
def test_the_fork_server_runs_probes_concurrently_and_survives_its_workers() -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ForkServer(preload=["autofit.probe.worker"]) as server:
        specs = [spec("tiny_mlp", batch_size=b) for b in (1, 2, 3, 4)]
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda s: run_probe(s, launcher=server), specs))
        assert [r.outcome for r in results] == [Outcome.OK] * 4
        assert [r.config["batch_size"] for r in results] == [1, 2, 3, 4]
        assert (
            run_probe(spec("tiny_mlp"), worker="workers.die", launcher=server).outcome
            is Outcome.CRASH
        )
        assert run_probe(spec("tiny_mlp"), launcher=server).outcome is Outcome.OK
