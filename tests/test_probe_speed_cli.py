"""`autofit probe` forks its worker from a fork server it starts before composing its
configuration (autofit/commands/probe.py): it answers as before, and the server never outlives it,
whether the probe finishes, the configuration is wrong, or a stop signal ends the command.

What a command started is found by its working directory, as in tests/test_signals.py: the
server, the worker and the worker's children inherit it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import in_process
from test_signals import TESTS, _gone_within


def _probe(folder: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "autofit", "probe", *args],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


def test_a_forked_probe_answers_and_leaves_no_process(tmp_path: Path) -> None:
    folder = tmp_path.resolve()
    proc = _probe(folder, "model=tiny_mlp", "backend=simulate", "batch_size=2", "out=r.json")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    result = json.loads((folder / "r.json").read_text())
    assert (result["outcome"], result["backend"]) == ("ok", "simulate")
    assert result["peak_bytes"] > 0
    assert not _gone_within(folder, 1)


def test_a_configuration_error_leaves_no_fork_server(tmp_path: Path) -> None:
    """In a process that lives on (here, this one): the server it warmed is killed, not left
    importing torch until its parent exits."""
    folder = tmp_path.resolve()
    done = in_process("probe", "model=nope", cwd=folder)
    assert done.returncode == 2
    assert done.stderr.startswith("autofit: error: unknown model 'nope'"), done.stderr
    assert not _gone_within(folder, 1)


@pytest.mark.long
def test_a_stop_signal_ends_the_probe_its_worker_and_the_server(tmp_path: Path) -> None:
    folder = tmp_path.resolve()
    hangs = folder / "hangs"
    hangs.mkdir()
    env = {**os.environ, "PYTHONPATH": str(TESTS), "AUTOFIT_TEST_HANG_DIR": str(hangs)}
    proc = _probe(
        folder, "model=custom", "model.entry=custom_models.hanging:build", "gpu=l4",
        "backend=simulate", "batch_size=1", "resolution=64", env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not list(hangs.glob("*.pids")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    assert list(hangs.glob("*.pids")), "the probe never started"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=5)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "Traceback" not in err, err
    assert "autofit: interrupted by SIGTERM" in err, err
    assert not _gone_within(folder, 2)
