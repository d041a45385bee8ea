"""Several `autofit search` processes on one study split its probes: each probe is claimed in the
storage before it runs, run by one worker and recorded once, and a claim whose worker died or
hangs is taken over. Starting any number of them at once on a fresh SQLite file or PostgreSQL
database never fails. PostgreSQL is a real server the session starts (tests/postgres.py)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from helpers import in_process, probe_counts, study_trials
from optuna.trial import TrialState
from postgres import PostgresServer, postgres_server  # noqa: F401  (the session fixture)

from autofit.records.probe import Outcome, ProbeResult
from autofit.search.claims import CLAIM_ATTR, Busy
from autofit.search.keys import probe_key
from autofit.search.recorder import StudyRecorder

STUDY = "shared"
# Four combinations in one wave, one probe each (batch 1 is the space's largest): work to split.
FOUR = """
batch_size: {min: 1, max: 1}
resolution: [x1]
knobs:
  precision: [bf16, bf16_pure]
  optimizer: [adamw, sgd]
  checkpointing: [false]
"""
ONE = FOUR.replace("[bf16, bf16_pure]", "[bf16]").replace("[adamw, sgd]", "[adamw]")


def _worker(
    cwd: Path, storage: str, space: str, out: str, *extra: str, study: str = STUDY
) -> subprocess.Popen[str]:
    """`autofit search` as a user starts it on a cluster node: the same command for every worker
    but `out=` (each worker's tables in a folder of its own, to compare their answers)."""
    command = [
        sys.executable, "-m", "autofit", "search", "model=tiny_mlp", "gpu=a40",
        f"space={space}", "backend=simulate", f"storage={storage}", f"study={study}",
        f"out={out}", *extra,
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finish(worker: subprocess.Popen[str], timeout: float = 600) -> tuple[int, str]:
    out, err = worker.communicate(timeout=timeout)
    return worker.returncode, out + err


def _summary(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "summary.json").read_text())


def _sqlite(tmp_path: Path, name: str = "studies.db") -> str:
    return f"sqlite:///{tmp_path / name}"


def _workers_split_the_probes(tmp_path: Path, storage: str, count: int) -> None:
    (tmp_path / "four.yaml").write_text(FOUR)
    # One worker alone on a storage of its own, at the same time: the answer to match.
    alone = _worker(tmp_path, _sqlite(tmp_path, "alone.db"), "four.yaml", "alone")
    # One of the workers also runs two probes at once in threads: the same claims.
    workers = [
        _worker(tmp_path, storage, "four.yaml", f"w{i}", f"jobs={1 + (i == 0)}")
        for i in range(count)
    ]
    finished = [_finish(w) for w in workers]
    for code, text in finished:
        assert code == 0, text
    code, text = _finish(alone)
    assert code == 0, text

    counts = probe_counts(storage, STUDY)
    assert len(counts) == 4 and set(counts.values()) == {1}, counts  # every probe once
    summaries = [_summary(tmp_path / f"w{i}") for i in range(count)]
    assert sum(s["new_probes"] for s in summaries) == 4  # each probe run by exactly one worker
    assert all(s["n_probes"] == 4 for s in summaries)  # and every worker has every answer
    reference = _summary(tmp_path / "alone")["best"]["config"]
    assert all(s["best"]["config"] == reference for s in summaries)
    assert not [
        t for t in study_trials(storage, STUDY) if t.state is TrialState.RUNNING
    ]  # no claim left


@pytest.mark.long
def test_workers_on_a_fresh_sqlite_file_split_the_probes(tmp_path: Path) -> None:
    _workers_split_the_probes(tmp_path, _sqlite(tmp_path), 3)


@pytest.mark.long
def test_workers_on_a_fresh_postgres_database_split_the_probes(
    tmp_path: Path,
    postgres_server: PostgresServer,  # noqa: F811
) -> None:
    _workers_split_the_probes(tmp_path, postgres_server.database(), 3)


@pytest.mark.slow
def test_eight_workers_on_postgres_split_the_probes(
    tmp_path: Path,
    postgres_server: PostgresServer,  # noqa: F811
) -> None:
    _workers_split_the_probes(tmp_path, postgres_server.database(), 8)


# -- opening a fresh storage from many processes at once -----------------------------------------

OPEN = """
import sys
from autofit.search.recorder import StudyRecorder
sys.stdin.readline()  # every process is started before any opens the storage
StudyRecorder(sys.argv[1], "fresh", {"model": "m", "gpu": "g"})
"""


@pytest.mark.long
@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_many_processes_opening_a_fresh_storage_at_once_all_succeed(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if kind == "sqlite":
        storage = _sqlite(tmp_path)
    else:
        storage = request.getfixturevalue("postgres_server").database()
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN, storage],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for _ in range(8)
    ]
    time.sleep(3)  # their imports done
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()
    results = [(p.wait(timeout=300), p.stdout.read() if p.stdout else "") for p in processes]
    assert [code for code, _ in results] == [0] * 8, [text for _, text in results]
    study = optuna.load_study(study_name="fresh", storage=storage)
    assert study.user_attrs == {"model": "m", "gpu": "g"}


# -- claims, in one process ----------------------------------------------------------------------

KNOBS = {"batch_size": 1, "resolution": 64, "precision": "bf16"}


def _key(batch: int = 1) -> str:
    return probe_key({**KNOBS, "batch_size": batch}, "simulate", 100, "m", "g")


def _result(outcome: Outcome = Outcome.OK, batch: int = 1) -> ProbeResult:
    return ProbeResult(
        outcome=outcome, backend="simulate", gpu="a40", model="tiny_mlp",
        config={**KNOBS, "batch_size": batch}, budget_bytes=100, peak_bytes=50, samples_per_s=1.0,
    )  # fmt: skip


def test_one_of_many_simultaneous_claims_wins(tmp_path: Path) -> None:
    storage = _sqlite(tmp_path)
    recorders = [StudyRecorder(storage, STUDY, {}) for _ in range(8)]
    start, outcomes = threading.Barrier(8), []

    def claim(recorder: StudyRecorder) -> None:
        start.wait()
        try:
            outcomes.append(recorder.claim(_key(), KNOBS, 60))
        except Busy:
            outcomes.append("busy")

    threads = [threading.Thread(target=claim, args=(r,)) for r in recorders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    won = [o for o in outcomes if o not in ("busy", None)]
    assert len(won) == 1, outcomes
    won[0].record(_result())
    assert probe_counts(storage, STUDY) == {_key(): 1}
    assert all(r.finished(_key()) is not None for r in recorders)  # every worker reads it
    lost = [t for t in study_trials(storage, STUDY) if t.system_attrs.get(CLAIM_ATTR) == "lost"]
    assert all(t.state is TrialState.PRUNED for t in lost)
    for recorder in recorders:
        recorder.close()


@pytest.mark.long
def test_a_claim_is_held_while_its_heartbeat_beats_and_taken_over_once_it_stops(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage, grace = _sqlite(tmp_path), 1.0
    first = StudyRecorder(storage, STUDY, {}, claim_grace_s=grace)
    second = StudyRecorder(storage, STUDY, {}, claim_grace_s=grace)
    held = first.claim(_key(), KNOBS, 60)
    assert held is not None
    deadline = time.monotonic() + 3 * grace  # three grace periods, beating: never stale
    while time.monotonic() < deadline:
        with pytest.raises(Busy):
            second.claim(_key(), KNOBS, 60)
        time.sleep(0.2)

    first.heartbeat.stop()  # the first worker hangs (or its machine is cut off)
    started = time.monotonic()
    while True:
        try:
            taken = second.claim(_key(), KNOBS, 60)
            break
        except Busy:
            time.sleep(0.1)
    # stale a grace period after the last beat it saw change (a beat, 0.25 s, before the stop)
    assert grace - 0.5 <= time.monotonic() - started < grace + 1.5
    assert taken is not None
    assert "has lapsed (no heartbeat for" in caplog.text
    taken.record(_result())
    with caplog.at_level(logging.WARNING):
        held.record(_result(Outcome.CRASH))  # the hung worker wakes: refused, not recorded
    assert "its result here is not recorded" in caplog.text
    assert probe_counts(storage, STUDY) == {_key(): 1}
    assert second.finished(_key()).outcome is Outcome.OK  # type: ignore[union-attr]
    first.close()
    second.close()


def test_crash_and_timeout_probes_of_an_earlier_run_are_probed_again(tmp_path: Path) -> None:
    storage = _sqlite(tmp_path)
    StudyRecorder(storage, STUDY, {}).record_probe(_key(1), _result(Outcome.CRASH, 1))
    StudyRecorder(storage, STUDY, {}).record_probe(_key(2), _result(Outcome.TIMEOUT, 2))
    StudyRecorder(storage, STUDY, {}).record_probe(_key(3), _result(Outcome.OOM, 3))

    rerun = StudyRecorder(storage, STUDY, {})
    assert rerun.finished(_key(1)) is None and rerun.finished(_key(2)) is None
    assert rerun.finished(_key(3)).outcome is Outcome.OOM  # type: ignore[union-attr]
    kept = StudyRecorder(storage, STUDY, {}, retry_failed=False)
    assert kept.finished(_key(1)).outcome is Outcome.CRASH  # type: ignore[union-attr]

    # A crash another worker records during this run is this run's answer, not retried.
    StudyRecorder(storage, STUDY, {}).record_probe(_key(4), _result(Outcome.CRASH, 4))
    assert rerun.finished(_key(4)).outcome is Outcome.CRASH  # type: ignore[union-attr]
    # Probed again, the new answer is the one read from then on.
    claim = rerun.claim(_key(1), {**KNOBS, "batch_size": 1}, 60)
    assert claim is not None
    claim.record(_result(Outcome.OK, 1))
    assert StudyRecorder(storage, STUDY, {}).finished(_key(1)).outcome is Outcome.OK  # type: ignore[union-attr]


def test_a_stored_trial_autofit_cannot_read_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = _sqlite(tmp_path)
    StudyRecorder(storage, STUDY, {}).record_probe(_key(1), _result())
    study = optuna.load_study(study_name=STUDY, storage=storage)
    good = _result().to_dict()
    odd = [
        {"key": 17, "kind": "probe", "result": good},  # another shape of key
        {"key": _key(2), "kind": "probe", "result": {**good, "outcome": "exploded"}},
        {"key": _key(3), "kind": "probe", "result": "not a result"},
        {"key": _key(4), "kind": "probe"},
    ]
    for attrs in odd:
        study.add_trial(optuna.trial.create_trial(state=TrialState.FAIL, user_attrs=attrs))

    with caplog.at_level(logging.WARNING):
        recorder = StudyRecorder(storage, STUDY, {})
    for number, why in [(1, "its key is int"), (2, "'exploded' is not a valid Outcome"),
                        (3, "cannot be read"), (4, "it holds no result")]:  # fmt: skip
        assert f"stored trial {number} is skipped: " in caplog.text
        assert why in caplog.text
    assert recorder.finished(_key(1)) is not None  # the readable ones are still answers
    assert recorder.finished(_key(2)) is None


def test_a_probe_autofit_did_not_finish_is_given_back_not_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autofit.errors import AutofitError
    from autofit.gpus import load_gpu
    from autofit.models import load_preset
    from autofit.search import prober as module

    def stopped(*args: Any, **kwargs: Any) -> ProbeResult:
        raise AutofitError("autofit is stopping")  # as the runner does when interrupted

    monkeypatch.setattr(module, "run_probe", stopped)
    storage = _sqlite(tmp_path)
    recorder = StudyRecorder(storage, STUDY, {})
    prober = module.Prober(
        load_preset("tiny_mlp"),
        load_gpu("a40"),
        "simulate",
        0.05,
        60,
        recorder,
        None,  # type: ignore[arg-type]
    )
    with pytest.raises(AutofitError):
        prober({"batch_size": 1})
    (trial,) = study_trials(storage, STUDY)
    assert trial.state is TrialState.PRUNED and trial.system_attrs[CLAIM_ATTR] == "released"
    assert not probe_counts(storage, STUDY)


# -- a worker that dies or hangs mid-probe -------------------------------------------------------


def _wait_for_claim(storage: str, worker: subprocess.Popen[str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert worker.poll() is None, _finish(worker)[1]
        try:
            if any(t.state is TrialState.RUNNING for t in study_trials(storage, STUDY)):
                return
        except KeyError:  # the study is not created yet
            pass
        time.sleep(0.05)
    raise AssertionError("the worker never claimed a probe")


@pytest.mark.long
def test_the_claim_of_a_killed_worker_is_taken_over(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text(ONE)
    storage, grace = _sqlite(tmp_path), "claim_grace_s=2"
    doomed = _worker(tmp_path, storage, "one.yaml", "a", grace)
    _wait_for_claim(storage, doomed)
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()

    code, text = _finish(_worker(tmp_path, storage, "one.yaml", "b", grace))
    assert code == 0, text
    assert "has lapsed (its worker process has exited); probing it here" in text
    assert list(probe_counts(storage, STUDY).values()) == [1]
    (abandoned,) = [t for t in study_trials(storage, STUDY) if t.state is TrialState.PRUNED]
    assert abandoned.system_attrs[CLAIM_ATTR].startswith("taken over: its worker process")


@pytest.mark.slow
def test_the_claim_of_a_hung_worker_is_taken_over_once_its_heartbeat_lapses(
    tmp_path: Path,
) -> None:
    (tmp_path / "one.yaml").write_text(ONE)
    storage, grace = _sqlite(tmp_path), "claim_grace_s=2"
    hung = _worker(tmp_path, storage, "one.yaml", "a", grace)
    _wait_for_claim(storage, hung)
    os.kill(hung.pid, signal.SIGSTOP)  # alive, but neither probing nor beating
    try:
        code, text = _finish(_worker(tmp_path, storage, "one.yaml", "b", grace))
    finally:
        os.kill(hung.pid, signal.SIGCONT)
    assert code == 0, text
    assert "has lapsed (no heartbeat for" in text
    code, text = _finish(hung)  # it wakes, finishes its probe, and may not record it
    assert code == 0, text
    assert "its result here is not recorded" in text
    assert list(probe_counts(storage, STUDY).values()) == [1]


# -- the settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "words"),
    [
        ("retry_failed=sometimes", "retry_failed='sometimes' is not valid; expected true or false"),
        ("claim_grace_s=0", "claim_grace_s=0 is not valid; expected seconds > 0"),
    ],
)
def test_bad_worker_settings_are_one_line_errors(setting: str, words: str, tmp_path: Path) -> None:
    done = in_process(
        "search", "model=tiny_mlp", "gpu=a40", "space=quick", "backend=simulate", setting,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1
