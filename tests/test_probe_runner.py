"""The parent never raises because a child failed: each failure is an ordinary result."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import spec

from autofit.probe import Outcome, ProbeResult, run_probe
from autofit.probe.launcher import ForkServer, Launcher, SpawnLauncher

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


def test_a_timeout_before_the_forked_worker_has_its_own_session_still_kills_it() -> None:
    # A timeout can fire as the server reports the fork, before the child's setsid: there is no
    # process group of its pid yet. (Seen once as a suite hung in the test above, on a loaded
    # machine where the server's imports outlasted the 3-second timeout.) A process of our own
    # group stands in for that child; the server's report of its exit, for the reaping.
    import subprocess
    import sys
    import threading

    from autofit.probe.launcher import _Forked

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    forked = _Forked(None, 1)  # type: ignore[arg-type]
    forked.pid = child.pid
    forked.started.set()

    def reaped() -> None:
        child.wait()
        forked.exited.set()

    threading.Thread(target=reaped, daemon=True).start()
    killer = threading.Thread(target=forked.kill_group, daemon=True)
    killer.start()
    killer.join(timeout=20)
    if killer.is_alive():
        child.kill()
    assert not killer.is_alive(), "kill_group waited on a child it never killed"
    assert child.returncode == -9


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
