"""Faults a search on a cluster meets, injected into the real parts: a PostgreSQL server stopped
and restarted under two workers, a PostgreSQL server that stays away, an SQLite file locked by
another process past the driver's timeout, a database that is damaged, on a disk that fills or
is read-only, a worker stopped (SIGSTOP) past its claim's grace and resumed, SIGTERM to a group of
workers as they write. What must hold (docs/cluster.md, Reliability): every finished probe is recorded
exactly once, a storage away for a while is waited for with one notice, one away too long or
broken ends the search in one line that says how to resume, a stopped group says what it
finished and is gone within 2 s.

The searches probe tests/custom_models/slow.py, whose steps take AUTOFIT_TEST_STEP_S seconds:
slow enough to be cut part-way, its scans reporting points besides the best batch."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import probe_counts, study_trials
from optuna.trial import TrialState
from postgres import running_server

from autofit.records.probe import Outcome, ProbeResult
from autofit.search import storage
from autofit.search.closing import close_claim
from autofit.search.keys import probe_key
from autofit.search.recorder import StudyRecorder
from autofit.search.retry import StorageUnavailable

TESTS = Path(__file__).parent
STUDY = "faults"
# Four structures in the first wave, two scans of two (the optimizers share a curve), each
# reporting its largest batch and the one above; their checkpointing children after.
SPACE = """
batch_size: {min: 1, max: 64}
resolution: [1024]
knobs:
  precision: [bf16, fp32]
  optimizer: [adamw, sgd]
  checkpointing: [false, true]
target:
  resolution: 1024
  speed_tolerance: 0
"""


def _search(
    cwd: Path, storage_url: str, out: str, *extra: str, step_s: float = 0.2, **popen: Any
) -> subprocess.Popen[str]:
    """`autofit search` as a worker on a cluster node runs it, on the slow model."""
    (cwd / "space.yaml").write_text(SPACE)
    env = {**os.environ, "PYTHONPATH": str(TESTS), "AUTOFIT_TEST_STEP_S": str(step_s)}
    command = [
        sys.executable, "-m", "autofit", "search", "model=custom",
        "model.entry=custom_models.slow:build", "gpu=l4", "space=space.yaml",
        "backend=simulate", f"storage={storage_url}", f"study={STUDY}", f"out={out}", "jobs=1",
        *extra,
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        **popen,
    )  # fmt: skip


def _finish(worker: subprocess.Popen[str], timeout: float = 600) -> tuple[int, str]:
    out, err = worker.communicate(timeout=timeout)
    return worker.returncode, out + err


def _wait_for(what: Any, timeout: float = 300, *workers: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for worker in workers:
            assert worker.poll() is None, _finish(worker)[1]
        try:
            if what():
                return
        except (KeyError, sqlite3.Error):  # the study is not there yet
            pass
        time.sleep(0.05)
    raise AssertionError("waited in vain")


def _finished(storage_url: str) -> int:
    return sum(probe_counts(storage_url, STUDY).values())


def _summary(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "summary.json").read_text())


def _one_line_error(text: str) -> str:
    """The only line a failed command printed on stderr after its progress lines, checked to be
    one line without a traceback."""
    assert "Traceback" not in text, text
    errors = [line for line in text.splitlines() if line.startswith("autofit: error:")]
    assert len(errors) == 1, text
    return errors[0]


# -- PostgreSQL away -------------------------------------------------------------------------------


@pytest.mark.long
def test_two_workers_ride_out_a_postgres_restart_and_record_every_probe_once(
    tmp_path: Path,
) -> None:
    with running_server() as server:
        url = server.database()
        alone = _search(tmp_path, f"sqlite:///{tmp_path / 'alone.db'}", "alone")
        workers = [_search(tmp_path, url, f"w{i}") for i in range(2)]
        _wait_for(lambda: _finished(url) >= 1, 300, *workers)
        server.halt()  # as a crash or a failover: every connection cut at once
        time.sleep(10)
        server.resume()
        finished = [_finish(w) for w in workers]
        for code, text in finished:
            assert code == 0, text
        assert _finish(alone)[0] == 0
        counts = probe_counts(url, STUDY)
        assert set(counts.values()) == {1}, counts  # no probe twice
        reference = _summary(tmp_path / "alone")
        assert len(counts) == reference["n_probes"]  # and none lost
        summaries = [_summary(tmp_path / f"w{i}") for i in range(2)]
        assert sum(s["new_probes"] for s in summaries) == len(counts)
        assert all(s["best"]["config"] == reference["best"]["config"] for s in summaries)
        assert not [t for t in study_trials(url, STUDY) if t.state is TrialState.RUNNING]
        said = "\n".join(text for _, text in finished)
        assert "cannot be reached (the server cannot be reached" in said, said
        assert "; retrying for up to 120 s" in said and " is back after " in said, said


@pytest.mark.long
def test_a_postgres_server_away_longer_than_the_patience_ends_the_search_in_one_line(
    tmp_path: Path,
) -> None:
    with running_server() as server:
        url = server.database()
        worker = _search(tmp_path, url, "out", "storage_patience_s=3")
        _wait_for(lambda: _finished(url) >= 1, 300, worker)
        kept = _finished(url)
        server.halt()
        halted = time.monotonic()
        code, text = _finish(worker, timeout=120)
        assert time.monotonic() - halted < 30  # the patience, a probe and the way out
        assert code == 1, text
        line = _one_line_error(text)
        assert f"the study storage {url} could not be reached for 3 s" in line, line
        assert "every probe that finished before is kept there; rerun `" in line, line

        # The command it prints, run as printed once the server is back, finishes the search
        # from where it stopped.
        server.resume()
        assert _finished(url) >= kept
        rerun = line.split("rerun `", 1)[1].split("` once it is back", 1)[0]
        env = {**os.environ, "PYTHONPATH": str(TESTS), "AUTOFIT_TEST_STEP_S": "0.2"}
        done = subprocess.run(
            ["bash", "-c", rerun], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert _summary(tmp_path / "out")["reused_probes"] >= kept
        assert set(probe_counts(url, STUDY).values()) == {1}


# -- SQLite locked, damaged, full, read-only ------------------------------------------------------


def _hold_lock(path: Path, seconds: float) -> subprocess.Popen[str]:
    """Another process holding `path`'s SQLite write lock for `seconds`, once it says so."""
    code = (
        "import sqlite3, sys, time\n"
        "connection = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "connection.execute('BEGIN EXCLUSIVE')\n"
        "print('locked', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n"
        "connection.execute('ROLLBACK')\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(path), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    return holder


def _result(batch: int = 1) -> ProbeResult:
    return ProbeResult(
        outcome=Outcome.OK, backend="simulate", gpu="a40", model="tiny_mlp",
        config={"batch_size": batch, "resolution": 64}, budget_bytes=100, peak_bytes=50,
        samples_per_s=1.0,
    )  # fmt: skip


@pytest.mark.long
def test_an_sqlite_file_locked_past_the_drivers_timeout_is_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(storage, "SQLITE_TIMEOUT_S", 0.5)  # the driver gives up after 0.5 s
    path = tmp_path / "studies.db"
    recorder = StudyRecorder(f"sqlite:///{path}", STUDY, {})
    key = probe_key({"batch_size": 1}, "simulate", 100, "m", "g")
    claim = recorder.claim(key, {"batch_size": 1}, 60)
    assert claim is not None
    holder = _hold_lock(path, 4)
    started = time.monotonic()
    with caplog.at_level("WARNING"):
        claim.record(_result())  # a probe finished while the file is locked
    waited = time.monotonic() - started
    holder.wait()
    assert 3 < waited < 10, waited
    assert recorder.finished(key)
    assert "cannot be reached (it is locked by another process); retrying for up to 120 s" in (
        caplog.text
    )
    assert re.search(r"is back after [3-9] s", caplog.text), caplog.text
    assert caplog.text.count("cannot be reached") == 1  # one notice for the outage, not per try


@pytest.mark.long
def test_an_sqlite_file_locked_past_the_patience_is_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage, "SQLITE_TIMEOUT_S", 0.5)
    path = tmp_path / "studies.db"
    recorder = StudyRecorder(f"sqlite:///{path}", STUDY, {}, patience_s=2)
    claim = recorder.claim(probe_key({"batch_size": 1}, "simulate", 100, "m", "g"), {}, 60)
    assert claim is not None
    holder = _hold_lock(path, 8)
    started = time.monotonic()
    with pytest.raises(StorageUnavailable) as caught:
        claim.record(_result())
    assert time.monotonic() - started < 5
    holder.kill()
    assert str(caught.value) == (
        f"the study storage sqlite:///{path} could not be reached for 2 s "
        "(it is locked by another process)"
    )


def _damaged(path: Path, how: str) -> None:
    if how == "random bytes":
        path.write_bytes(os.urandom(8192))
        return
    # a real study's file, with random bytes written over its pages past the first
    recorder = StudyRecorder(f"sqlite:///{path}", STUDY, {})
    recorder.record_probe(probe_key({"batch_size": 1}, "simulate", 100, "m", "g"), _result())
    with path.open("r+b") as file:
        file.seek(4096)
        file.write(os.urandom(path.stat().st_size - 4096))


@pytest.mark.long
@pytest.mark.parametrize(
    ("how", "words"),
    [
        ("random bytes", "it is damaged: not an SQLite database (file is not a database)"),
        ("pages overwritten", "it is damaged: a corrupt SQLite database"),
    ],
)
def test_a_damaged_database_is_named_at_once(tmp_path: Path, how: str, words: str) -> None:
    path = tmp_path / "studies.db"
    _damaged(path, how)
    started = time.monotonic()
    code, text = _finish(_search(tmp_path, f"sqlite:///{path}", "out"))
    assert time.monotonic() - started < 60  # no retries: at once, after the start-up
    assert code == 1, text
    line = _one_line_error(text)
    assert f"the study storage sqlite:///{path} failed: {words}" in line, line
    assert line.endswith("once that is mended, or with another storage="), line


def _mount_small_disk(folder: Path, size: str) -> None:
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True, text=True,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"root here may not mount a tmpfs ({mounted.stderr.strip()})")


@pytest.mark.long
@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("full", "the study storage sqlite:///{path} failed: the disk it is on is full"),
        # found before the search opens the study (autofit/paths.py ensure_writable)
        ("read-only", "cannot write the study storage to {path}: not a writable file path"),
    ],
)
def test_a_full_or_read_only_disk_is_named_at_once_and_what_it_holds_is_kept(
    tmp_path: Path, fault: str, words: str
) -> None:
    disk = tmp_path / "disk"
    _mount_small_disk(disk, "2m")
    try:
        url = f"sqlite:///{disk / 'studies.db'}"
        code, text = _finish(_search(tmp_path, url, "first", step_s=0))
        assert code == 0, text
        kept = probe_counts(url, STUDY)
        if fault == "full":
            with (disk / "filler").open("wb") as filler:  # every byte the disk has left
                try:
                    while True:
                        filler.write(b"\0" * 65536)
                        filler.flush()
                except OSError:
                    pass
        else:
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        (tmp_path / "more.yaml").write_text(SPACE.replace("[bf16, fp32]", "[bf16_pure]"))
        code, text = _finish(
            _search(tmp_path, url, "second", "space=more.yaml", step_s=0), timeout=120
        )
        assert code == 1, text
        line = _one_line_error(text)
        assert words.format(path=disk / "studies.db") in line, line
        assert probe_counts(url, STUDY) == kept  # the probes stored before are all there
    finally:
        subprocess.run(["umount", str(disk)], check=True)


# -- exactly once ----------------------------------------------------------------------------------


def _stop_outside_a_write(worker: subprocess.Popen[str], path: Path) -> None:
    """SIGSTOP `worker` at a moment it holds no lock on the SQLite file at `path`. Stopped inside
    a write (its heartbeat's, every grace/4) it would hold the file's lock until it resumes: the
    others could not write for as long (SQLite has one writer; docs/cluster.md, Reliability)."""
    for _ in range(100):
        os.kill(worker.pid, signal.SIGSTOP)
        connection = sqlite3.connect(path, timeout=0.2, isolation_level=None)
        try:
            connection.execute("BEGIN EXCLUSIVE")  # no one else reading or writing
            connection.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:  # stopped inside a transaction: let it finish
            os.kill(worker.pid, signal.SIGCONT)
            time.sleep(0.05)
        finally:
            connection.close()
    raise AssertionError("the worker was inside a write at every try")


@pytest.mark.long
def test_a_worker_stopped_past_its_grace_records_nothing_of_its_scan(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    grace = "claim_grace_s=2"
    stopped = _search(tmp_path, url, "a", grace, step_s=0.5)

    def scanning() -> bool:
        return any(
            t.state is TrialState.RUNNING and '"scan"' in t.user_attrs.get("key", "")
            for t in study_trials(url, STUDY)
        )

    _wait_for(scanning, 300, stopped)
    _stop_outside_a_write(stopped, tmp_path / "studies.db")  # alive, not beating nor recording
    try:
        code, text = _finish(_search(tmp_path, url, "b", grace, step_s=0.5))
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    assert code == 0, text
    assert "has lapsed (no heartbeat for" in text
    code, text = _finish(stopped)  # its scan ends, and none of it may be recorded
    assert code == 0, text
    assert re.search(
        r"its result here is not recorded, nor the \d+ other points? of its scan", text
    )
    counts = probe_counts(url, STUDY)
    assert set(counts.values()) == {1}, counts
    assert _summary(tmp_path / "a")["n_probes"] == _summary(tmp_path / "b")["n_probes"]


def _in_group(group: int) -> list[int]:
    """The processes of process group `group` still running (not zombies)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:  # gone meanwhile
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if fields and fields[0] != "Z" and int(fields[2]) == group:
            found.append(int(entry.name))
    return found


@pytest.mark.long
def test_sigterm_to_a_group_of_workers_as_they_write(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    (tmp_path / "space.yaml").write_text(SPACE)
    env = {**os.environ, "PYTHONPATH": str(TESTS), "AUTOFIT_TEST_STEP_S": "0.2"}
    one = [
        sys.executable, "-m", "autofit", "search", "model=custom",
        "model.entry=custom_models.slow:build", "gpu=l4", "space=space.yaml",
        "backend=simulate", f"storage={url}", f"study={STUDY}", "jobs=2",
    ]  # fmt: skip
    # One job script starting three workers, as a scheduler's step does: one process group.
    script = " ".join(f"{shlex.join(one)} out=w{i} 2>w{i}.err &" for i in range(3)) + " wait"
    group = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=env, start_new_session=True)
    _wait_for(lambda: _finished(url) >= 3, 300)
    os.killpg(group.pid, signal.SIGTERM)
    sent = time.monotonic()
    while _in_group(group.pid) and time.monotonic() - sent < 10:
        time.sleep(0.02)
    assert time.monotonic() - sent < 2, f"still running 2 s after SIGTERM: {_in_group(group.pid)}"
    group.wait()
    said = [(tmp_path / f"w{i}.err").read_text().strip().splitlines()[-1] for i in range(3)]
    finished = unsettled = 0
    for line in said:
        found = re.match(
            r"autofit: interrupted by SIGTERM; (\d+) probes? finished here, stored in study "
            r"faults(?: \((\d+) writes? of more still under way as it stopped\))?; rerun", line
        )  # fmt: skip
        assert found, said
        finished += int(found[1])
        unsettled += int(found[2] or 0)
    # What they say they finished is what the study holds (a write still under way when a worker
    # stopped waiting, on a busy file, is stored whole or not at all), and no claim holds part
    # of a result. (A claim being made as the stop came may be left RUNNING, without one.)
    assert finished <= _finished(url) <= finished + 3 * unsettled, said
    trials = study_trials(url, STUDY)
    assert not [t for t in trials if not t.state.is_finished() and "outcome" in t.user_attrs]
    assert not [t for t in trials if t.state is TrialState.PRUNED and "outcome" in t.user_attrs]

    # Resumed, the search finishes with every probe recorded once and no claim left.
    code, text = _finish(_search(tmp_path, url, "resumed"))
    assert code == 0, text
    assert set(probe_counts(url, STUDY).values()) == {1}
    assert _summary(tmp_path / "resumed")["reused_probes"] >= finished
    assert not [t for t in study_trials(url, STUDY) if t.state is TrialState.RUNNING]


def test_a_claim_and_its_scans_points_are_written_together_or_not_at_all(tmp_path: Path) -> None:
    """The transaction that closes a claim fails part-way (a point whose param the study fixed
    to another kind: Optuna refuses it after the claim's result and state are written): none of
    it is stored, and the claim is still RUNNING without a result."""
    from optuna.distributions import CategoricalDistribution

    url = f"sqlite:///{tmp_path / 'studies.db'}"
    recorder = StudyRecorder(url, STUDY, {})
    key = probe_key({"batch_size": 1}, "simulate", 100, "m", "g")
    claim = recorder.claim(key, {"batch_size": 1}, 60)
    assert claim is not None
    done = recorder._trial_of(key, _result(1))
    clash = recorder._trial_of(probe_key({"batch_size": 2}, "simulate", 100, "m", "g"), _result(2))
    clash.distributions["batch_size"] = CategoricalDistribution([2, 3])
    with pytest.raises(ValueError):
        close_claim(
            recorder._storage, recorder._study_id, claim.trial_id, lambda action: action(),
            done, {"batch_size"}, "", [clash],
        )  # fmt: skip
    (trial,) = study_trials(url, STUDY)
    assert trial.state is TrialState.RUNNING and "result" not in trial.user_attrs
    claim.record(_result(1))  # the claim is still this worker's to close
    assert list(probe_counts(url, STUDY).values()) == [1]
