"""Stopping a real `autofit search` whose probes hang (tests/custom_models/hanging.py): a stop
signal ends it and every process it started within 2 s, with one line; SIGKILL leaves nothing
running past the probes' timeout; queued probes never start; nothing unfinished is recorded.

What a search started is found by its working directory: the search runs in the test's folder,
and its fork server, workers and their children inherit it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).parent

# Four combinations, one batch each: with jobs=2, two probes hang and two wait in the queue.
SPACE = """
batch_size: {min: 1, max: 1}
resolution: [64]
knobs:
  precision: [bf16, fp32]
  optimizer: [adamw, sgd]
target:
  resolution: 64
"""


def _left(folder: Path) -> list[int]:
    """Processes (not zombies) working in `folder`, other than this one."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if Path(os.readlink(entry / "cwd")) != folder:
                continue
            if "\nState:\tZ" in (entry / "status").read_text():
                continue
        except OSError:  # gone meanwhile, or not ours to read
            continue
        found.append(int(entry.name))
    return found


def _gone_within(folder: Path, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while _left(folder) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _left(folder)


def _hanging_search(folder: Path, timeout_s: float = 600) -> tuple[subprocess.Popen[str], Path]:
    """`autofit search` on the hanging model with jobs=2, once both first probes hang."""
    hangs = folder / "hangs"
    hangs.mkdir()
    (folder / "space.yaml").write_text(SPACE)
    (folder / "tmp").mkdir()  # the search's temporary files, to see that none is left
    env = {**os.environ, "PYTHONPATH": str(TESTS), "AUTOFIT_TEST_HANG_DIR": str(hangs)}
    env["TMPDIR"] = str(folder / "tmp")
    proc = subprocess.Popen(
        [sys.executable, "-m", "autofit", "search", "model=custom", "gpu=l4", "space=space.yaml",
         "model.entry=custom_models.hanging:build", "jobs=2", f"timeout_s={timeout_s}"],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while len(list(hangs.glob("*.pids"))) < 2 and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    assert len(list(hangs.glob("*.pids"))) == 2, "the probes never started"
    time.sleep(0.3)  # both grandchildren written down; the queue is full
    return proc, hangs


def _recorded_probes(folder: Path) -> int:
    """Probes recorded as answers (COMPLETE, or FAIL for a crash or a timeout): not a claim
    released (PRUNED) or one left RUNNING."""
    import sqlite3

    db = folder / "results" / "studies.db"
    with sqlite3.connect(db) as connection:
        query = "SELECT COUNT(*) FROM trials WHERE state IN ('COMPLETE', 'FAIL')"
        return connection.execute(query).fetchone()[0]


@pytest.mark.long
@pytest.mark.parametrize(
    "sig",
    [
        signal.SIGTERM,
        pytest.param(signal.SIGINT, marks=pytest.mark.slow),
        pytest.param(signal.SIGHUP, marks=pytest.mark.slow),
    ],
    ids=lambda s: s.name,
)
def test_a_stop_signal_ends_the_search_and_all_its_probes_within_2_s(
    tmp_path: Path, sig: signal.Signals
) -> None:
    folder = tmp_path.resolve()
    proc, hangs = _hanging_search(folder)
    sent = time.monotonic()
    proc.send_signal(sig)  # the search alone, as a scheduler or a terminal would reach it
    try:
        out, err = proc.communicate(timeout=2)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the search was still running 2 s after {sig.name}")
    left = _gone_within(folder, 2 - (time.monotonic() - sent))
    assert not left, f"processes still running 2 s after {sig.name}: {left}"
    assert proc.returncode == 128 + sig
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(
        f"autofit: interrupted by {sig.name}; 0 probes finished here, stored in"
    ), err
    assert last.endswith("rerun the same command to resume"), err
    # The two queued probes never started, and neither killed probe is anyone's answer.
    assert len(list(hangs.glob("*.pids"))) == 2
    assert _recorded_probes(folder) == 0
    # What the scans shared (autofit/fastpath/shared_updates.py) went with the search.
    assert not list((folder / "tmp").glob("autofit-updates-*"))


@pytest.mark.long
def test_sigkill_of_the_search_and_its_group_leaves_no_probe_running(tmp_path: Path) -> None:
    folder = tmp_path.resolve()
    proc, _ = _hanging_search(folder)
    os.killpg(proc.pid, signal.SIGKILL)  # what a scheduler's last word reaches
    proc.wait()
    # The fork server reads the end of its input, kills its workers' groups and exits.
    assert not _gone_within(folder, 2)


def _server_of(search: int, folder: Path) -> int:
    """The fork server: the search's child (its workers, forked from it, share its command)."""

    def parent(pid: int) -> int:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])

    (server,) = [pid for pid in _left(folder) if parent(pid) == search]
    return server


@pytest.mark.slow
def test_probes_whose_search_and_server_cannot_end_them_end_at_their_timeout(
    tmp_path: Path,
) -> None:
    # The search is SIGKILLed while its fork server is stopped (SIGSTOP), so neither can kill
    # the hanging probes: each worker's own watchdog must end its group at its deadline plus
    # grace. The search is simulated, so its workers are scans of two structures each (the
    # optimizers share one), whose deadline is SCAN_TRACES traces of each at timeout_s.
    from autofit.fastpath.scans import SCAN_TRACES
    from autofit.probe.tether import GRACE_S

    folder = tmp_path.resolve()
    timeout_s = 5.0
    proc, hangs = _hanging_search(folder, timeout_s=timeout_s)
    probes = [int(p.stem) for p in hangs.glob("*.pids")]
    started = min(p.stat().st_mtime for p in hangs.glob("*.pids"))
    server = _server_of(proc.pid, folder)
    os.kill(server, signal.SIGSTOP)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        # the pids file comes after the start
        deadline = started + SCAN_TRACES * 2 * timeout_s + GRACE_S + 2
        while _left(folder) != [server] and time.time() < deadline:
            time.sleep(0.1)
        assert _left(folder) == [server], f"probes {probes} outlived their timeout"
    finally:
        os.kill(server, signal.SIGCONT)
    # Awake again, the server finds its search gone and exits.
    assert not _gone_within(folder, 2)
