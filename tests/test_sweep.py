"""`autofit search -m ...` through each Hydra launcher: every job's exit status comes back to the
sweep, which exits non-zero with one line naming each failed job, whichever process ran it; the
sweep ends with one table of its jobs' best runs, printed and as CSV, and leaves no empty folder."""

from __future__ import annotations

import csv
import json
import os
import re
import time
from pathlib import Path

import pytest
from helpers import autofit

from autofit.commands.search import run_config
from autofit.commands.sweep import failed_jobs, summary_line, sweep
from autofit.errors import AutofitError
from autofit.results import load_study
from autofit.units import size

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


PRINTED_HEADER = ["model", "gpu", "answer", "best run", "samples/s", "peak", "headroom",
                  "of budget", "simulated", "results"]  # fmt: skip
CSV_HEADER = ["model", "gpu", "answer", "best", "samples_per_s", "peak_bytes", "headroom_bytes",
              "headroom_share", "simulated", "results"]  # fmt: skip


def _tables(stdout: str, cwd: Path) -> tuple[list[list[str]], list[list[str]]]:
    """The sweep's table as printed (cells split where the columns are two spaces apart, no
    cell holding two) and as its CSV, at the path the sweep printed."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"the sweep's \d+ jobs", line))
    end = next(i for i, line in enumerate(lines) if line.startswith("the sweep's table: "))
    printed = [re.split(r" {2,}", line) for line in lines[start + 1 : end]]
    path = cwd / lines[end].removeprefix("the sweep's table: ")
    assert path.parent.parent == cwd / "results" / "multirun" and path.name == "sweep.csv"
    return printed, list(csv.reader(path.open(newline="")))


def _empty_folders(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_dir() and not any(p.iterdir())]


def _fits(study_folder: Path) -> tuple[list[str], list[str]]:
    """A job's row, printed and in the CSV, from what its search wrote: the best run of the
    tiny space (batch 2, the largest; bf16 its one precision), its speed, peak and headroom."""
    study = load_study(study_folder)
    best, budget = study.best, study.budget_bytes
    assert best is not None
    speed, peak = best["samples_per_s"], best["peak_bytes"]
    model, gpu = study.summary["model"], study.summary["gpu"]
    folder = f"results/{study_folder.name}"
    printed = [model, gpu, "fits", "b=2 res=64", f"{speed:.3f}", size(peak), size(budget - peak),
               f"{(budget - peak) / budget:.1%}", "true", folder]  # fmt: skip
    raw = [model, gpu, "fits", "b=2 res=64", str(speed), str(peak), str(budget - peak),
           str((budget - peak) / budget), "true", folder]  # fmt: skip
    return printed, raw


@pytest.mark.long
def test_a_sweep_ends_with_one_table_of_its_jobs_printed_and_as_csv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY_SPACE)
    overrides = ["model=tiny_mlp", "gpu=a40,l4", "backend=simulate", "space=tiny.yaml"]
    assert sweep("search", overrides, run_config) == 0
    printed, written = _tables(capsys.readouterr().out, tmp_path)
    rows = [_fits(tmp_path / "results" / f"tiny_mlp-{gpu}-tiny") for gpu in ("a40", "l4")]
    assert printed == [PRINTED_HEADER, *(p for p, _ in rows)]
    assert written == [CSV_HEADER, *(r for _, r in rows)]
    # Hydra's job folders (0/ and 1/, each with only a .hydra/ copy of its config) are not made
    (sweep_dir,) = (tmp_path / "results" / "multirun").iterdir()
    assert sorted(p.name for p in sweep_dir.iterdir()) == ["multirun.yaml", "sweep.csv"]
    assert _empty_folders(tmp_path) == []


@pytest.mark.long
def test_a_job_where_nothing_fits_and_a_failed_one_have_their_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 99% margin leaves a40 460 MiB, less than tiny_mlp's smallest peak: that search writes its
    folder and exits 1. The second job's space does not exist: exit 2, no results."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY_SPACE)
    overrides = ["model=tiny_mlp", "gpu=a40", "backend=simulate", "margin=0.99",
                 "space=tiny.yaml,missing.yaml"]  # fmt: skip
    assert sweep("search", overrides, run_config) == 1
    printed, written = _tables(capsys.readouterr().out, tmp_path)
    study = load_study(tmp_path / "results" / "tiny_mlp-a40-tiny")
    smallest = study.summary["nothing_fits"]["smallest_peak_bytes"]
    nothing = f"nothing fits: smallest peak {size(smallest)}, budget {size(study.budget_bytes)}"
    # space is the one setting that differs between the jobs: it gets a column
    assert printed == [
        ["model", "gpu", "space", *PRINTED_HEADER[2:]],
        ["tiny_mlp", "a40", "tiny.yaml", "nothing_fits", nothing, "-", "-", "-", "-", "true",
         "results/tiny_mlp-a40-tiny"],
        ["tiny_mlp", "a40", "missing.yaml", "failed", "exit 2", "-", "-", "-", "-", "-", "-"],
    ]  # fmt: skip
    assert written == [
        ["model", "gpu", "space", *CSV_HEADER[2:]],
        ["tiny_mlp", "a40", "tiny.yaml", "nothing_fits", nothing, "", "", "", "", "true",
         "results/tiny_mlp-a40-tiny"],
        ["tiny_mlp", "a40", "missing.yaml", "failed", "exit 2", "", "", "", "", "", ""],
    ]  # fmt: skip
    # A later job that fails before its search writes anything is not answered by that folder.
    assert sweep("search", [*overrides[:4], "space=tiny.yaml", "target.min_batch=3"], run_config)
    printed, _ = _tables(capsys.readouterr().out, tmp_path)
    assert printed[1][2:] == ["failed", "exit 2", "-", "-", "-", "-", "-", "-"]
    assert _empty_folders(tmp_path) == []


def _succeeds(cfg) -> int:
    return 0


def test_a_sweep_folder_of_the_user_s_gets_the_logs_and_the_table_and_no_empty_job_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """hydra.sweep.dir is the user's (with a time to the microsecond: read once, so the jobs'
    logs and the table land in the one folder), and the folder per job a hydra.sweep.subdir
    makes is removed once the sweep ends empty, with submitit_local's `.submitit/%j`."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))  # the job imports this module
    overrides = [
        "model=tiny_mlp", "gpu=l4,a40", "hydra/launcher=submitit_local",
        "hydra.sweep.dir=sweeps/${now:%H-%M-%S-%f}", "hydra.sweep.subdir=job/${hydra.job.num}",
    ]  # fmt: skip
    assert sweep("search", overrides, _succeeds) == 0
    (sweep_dir,) = (tmp_path / "sweeps").iterdir()
    assert sorted(p.name for p in sweep_dir.iterdir()) == [
        ".submitit",
        "multirun.yaml",
        "sweep.csv",
    ]
    assert len(list(sweep_dir.glob(".submitit/*/*_log.out"))) == 2
    assert f"the sweep's table: sweeps/{sweep_dir.name}/sweep.csv" in capsys.readouterr().out
    assert _empty_folders(tmp_path) == []
    assert not (tmp_path / "results" / "multirun").exists()


# submitit_local in the default run; joblib and basic (which the in-process test below also runs)
# each take as long, so under `pytest -m slow`.
@pytest.mark.long
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
    # the table has both jobs' rows, whichever process ran them, and no folder is left empty
    printed, written = _tables(done.stdout, tmp_path)
    ran, _ = _fits(tmp_path / "results" / "tiny_mlp-a40-tiny")
    assert [row[:3] for row in written] == [["model", "gpu", "space"], ["tiny_mlp", "a40",
                                            "tiny.yaml"], ["tiny_mlp", "a40", "missing.yaml"]]  # fmt: skip
    assert printed[1] == [*ran[:2], "tiny.yaml", *ran[2:]]
    assert printed[2] == ["tiny_mlp", "a40", "missing.yaml", "failed", "exit 2", *["-"] * 6]
    assert _empty_folders(tmp_path) == []


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


@pytest.mark.long
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
