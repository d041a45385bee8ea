"""`autofit search -m ...` through each Hydra launcher: every job's exit status comes back to the
sweep, which exits non-zero with one line naming each failed job, whichever process ran it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from helpers import autofit

from autofit.commands.sweep import failed_jobs, summary_line, sweep
from autofit.errors import AutofitError

# Two probes on the smallest model: a job takes seconds.
TINY_SPACE = """
batch_size: {min: 1, max: 2}
resolution: [x1]
knobs:
  precision: [bf16]
"""

# The second job's space is a file that is not there: the override passes the sweep's checks
# (a space is read when its search starts) and the job fails at run time with exit 2.
FAILING_SWEEP = ["model=tiny_mlp", "gpu=a40", "backend=simulate", "space=tiny.yaml,missing.yaml"]
SUMMARY = (
    "autofit: 1 of 2 jobs of the sweep failed: "
    "model=tiny_mlp gpu=a40 backend=simulate space=missing.yaml (exit 2)"
)


def _summary_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "jobs of the sweep failed" in line]


# submitit_local in the default run; joblib and basic (which the in-process test below also runs)
# each take as long, so under `pytest -m slow`.
@pytest.mark.parametrize(
    "launcher",
    [
        "submitit_local",
        pytest.param("joblib", marks=pytest.mark.slow),
        pytest.param("basic", marks=pytest.mark.slow),
    ],
)
def test_a_failed_job_fails_the_sweep_under_every_launcher(tmp_path: Path, launcher: str) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY_SPACE)
    done = autofit("search", "-m", *FAILING_SWEEP, f"hydra/launcher={launcher}", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert _summary_lines(done.stderr) == [SUMMARY]
    # the other job ran to the end
    summary = json.loads((tmp_path / "results" / "tiny_mlp-a40-tiny" / "summary.json").read_text())
    # its scan reports one point: batch 2, the space's largest, fits
    assert summary["n_probes"] == 1 and summary["best"]["config"]["batch_size"] == 2
    if launcher == "submitit_local":  # the job's own message is in its submitit log
        logs = (tmp_path / "results" / "multirun").glob("*/.submitit/*/*_log.err")
        assert any("space=missing.yaml: no such file" in log.read_text() for log in logs)


@pytest.mark.slow
def test_a_sweep_whose_jobs_all_succeed_exits_0_and_prints_no_summary(tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY_SPACE)
    done = autofit(
        "search", "-m", "model=tiny_mlp", "gpu=a40,l4", "backend=simulate", "space=tiny.yaml",
        "hydra/launcher=submitit_local", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _summary_lines(done.stderr) == []
    for gpu in ("a40", "l4"):
        assert (tmp_path / "results" / f"tiny_mlp-{gpu}-tiny" / "summary.json").exists()


def test_a_job_that_raises_counts_as_failed_and_the_others_still_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The basic sweeper re-raises the first failed job's exception and stops the sweep; a job
    that raises must instead come back as a failure, and every other job must run."""
    monkeypatch.chdir(tmp_path)
    ran = []

    def task(cfg) -> int:
        ran.append(cfg.gpu.name)
        if cfg.gpu.name == "l4":
            raise RuntimeError("a bug in the job")
        return 0

    code = sweep("search", ["model=tiny_mlp", "gpu=l4,a40,l40s"], task)
    err = capsys.readouterr().err
    assert code == 1
    assert len(ran) == 3
    assert _summary_lines(err) == [
        "autofit: 1 of 3 jobs of the sweep failed: model=tiny_mlp gpu=l4 (exit 1)"
    ]
    assert "RuntimeError: a bug in the job" in err  # the traceback, where the job's log goes


@pytest.mark.slow
def test_four_jobs_started_together_on_a_fresh_storage_all_succeed(tmp_path: Path) -> None:
    """submitit_local starts every job at once: they create the study storage together."""
    (tmp_path / "tiny.yaml").write_text(TINY_SPACE)
    gpus = ["a40", "l4", "l40s", "a10g"]
    done = autofit(
        "search", "-m", "model=tiny_mlp", f"gpu={','.join(gpus)}", "backend=simulate",
        "space=tiny.yaml", "jobs=1", "hydra/launcher=submitit_local", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _summary_lines(done.stderr) == []
    for gpu in gpus:
        summary = json.loads(
            (tmp_path / "results" / f"tiny_mlp-{gpu}-tiny" / "summary.json").read_text()
        )
        assert summary["n_probes"] == 1  # batch 2, the space's largest, fits


def test_a_job_hydra_marks_failed_counts_with_its_exception_and_a_password_is_masked() -> None:
    from hydra.core.utils import JobReturn, JobStatus

    returns = [
        [
            JobReturn(overrides=["gpu=a40"], status=JobStatus.COMPLETED, _return_value=0),
            JobReturn(overrides=["gpu=l4"], status=JobStatus.FAILED, _return_value=OSError()),
        ],
        [
            JobReturn(
                overrides=["gpu=l40s", r"storage=postgresql\://me\:s3cret@db\:5432/autofit"],
                status=JobStatus.COMPLETED,
                _return_value=3,
            )
        ],
    ]
    failed = failed_jobs(returns)
    assert failed == [
        ("gpu=l4", "exit OSError"),
        (r"gpu=l40s storage=postgresql\://me\:s3cret@db\:5432/autofit", "exit 3"),
    ]
    assert summary_line(failed, 3) == (
        "autofit: 2 of 3 jobs of the sweep failed: gpu=l4 (exit OSError); "
        r"gpu=l40s storage=postgresql\://me\:***@db\:5432/autofit (exit 3)"
    )


def _dies_fails_or_raises(cfg) -> int:
    """l4's job dies without a word (as one SLURM kills at its time limit), l40s's exits 2, a10g's
    raises, a40's succeeds."""
    if cfg.gpu.name == "l4":
        os._exit(9)
    if cfg.gpu.name == "a10g":
        raise RuntimeError("a bug in the job")
    return 2 if cfg.gpu.name == "l40s" else 0


def test_a_job_that_dies_is_listed_with_every_other_failed_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """submitit has no return for a job that died and its launcher raises at the first such job;
    the sweep still waits for every job and names each failed one, the dead one with submitit's
    state for it (a local job's process that exited without a result is FINISHED)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # the job imports this module
    overrides = ["model=tiny_mlp", "gpu=l4,l40s,a10g,a40", "hydra/launcher=submitit_local"]
    assert sweep("search", overrides, _dies_fails_or_raises) == 1
    assert _summary_lines(capsys.readouterr().err) == [
        "autofit: 3 of 4 jobs of the sweep failed: "
        "model=tiny_mlp gpu=l4 (died without a result: state FINISHED); "
        "model=tiny_mlp gpu=l40s (exit 2); "
        "model=tiny_mlp gpu=a10g (exit 1)"
    ]


def _dies_at_once_or_fails_late(cfg) -> int:
    if cfg.gpu.name == "l4":
        os._exit(9)
    time.sleep(25)  # still running when the launcher gives up on l4 (after submitit's 15 s)
    return 3


@pytest.mark.slow
def test_the_sweep_waits_for_the_jobs_still_running_when_the_launcher_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    overrides = ["model=tiny_mlp", "gpu=l4,a40", "hydra/launcher=submitit_local"]
    assert sweep("search", overrides, _dies_at_once_or_fails_late) == 1
    assert _summary_lines(capsys.readouterr().err) == [
        "autofit: 2 of 2 jobs of the sweep failed: "
        "model=tiny_mlp gpu=l4 (died without a result: state FINISHED); "
        "model=tiny_mlp gpu=a40 (exit 3)"
    ]


def test_jobs_that_cannot_load_their_task_are_listed_as_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without this test module on the jobs' path, each job fails to unpickle its call: submitit
    stores the error as the job's result and its launcher raises FailedJobError at the first."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    overrides = ["model=tiny_mlp", "gpu=l4,a40", "hydra/launcher=submitit_local"]
    assert sweep("search", overrides, _dies_fails_or_raises) == 1
    assert _summary_lines(capsys.readouterr().err) == [
        "autofit: 2 of 2 jobs of the sweep failed: "
        "model=tiny_mlp gpu=l4 (exit FailedJobError); model=tiny_mlp gpu=a40 (exit FailedJobError)"
    ]


def test_a_launcher_failure_that_is_not_a_job_s_stops_the_sweep_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error the sweep cannot attribute to jobs (here submitit refuses the launcher's settings
    before any job starts) keeps the one line naming it, not a traceback."""
    monkeypatch.chdir(tmp_path)
    overrides = [
        "model=tiny_mlp", "gpu=l4,a40", "hydra/launcher=submitit_local", "hydra.launcher.nodes=2",
    ]  # fmt: skip
    with pytest.raises(AutofitError) as error:
        sweep("search", overrides, _dies_fails_or_raises)
    assert str(error.value) == (
        "the sweep's launcher stopped: ValueError: LocalExecutor can use only one node. Use nodes=1"
    )
