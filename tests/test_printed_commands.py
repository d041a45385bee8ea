"""Every command autofit prints for the user to run runs as printed, pasted into a shell: from a
real search of a user's own model whose study name holds `;` and `'` (Hydra's grammar stops at
both unquoted) and whose space is a .yaml path, each command is collected where autofit prints
it and run by `bash -c`, and must do what it says (autofit/command_line.py quotes them)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import in_process

TESTS = Path(__file__).parent  # the user's model, custom_models.tiny, is importable from here
STUDY = "night's run; v2"
AS_TYPED = "study='night\\'s run; v2'"  # the name in Hydra's quotes, as a user writes it
SPACE = "spaces/tiny.yaml"  # a path: the summary's `space` keeps only its stem
TINY = "batch_size: {min: 1, max: 2}\nresolution: [x1]\nknobs:\n  precision: [bf16]\n"


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working folder with one real study, searched once for the module (for the hydra
    trainer, so that the report's export line names a target and runs whole)."""
    cwd = tmp_path_factory.mktemp("printed")
    (cwd / "spaces").mkdir()
    (cwd / SPACE).write_text(TINY)
    done = in_process(
        "search", "model=custom", "model.entry=custom_models.tiny:build", "gpu=a40",
        "backend=simulate", f"space={SPACE}", AS_TYPED, "trainer=hydra", "jobs=1",
        cwd=cwd, pythonpath=TESTS,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return cwd


@pytest.fixture
def workdir(searched: Path, tmp_path: Path) -> Path:
    cwd = tmp_path / "work"
    shutil.copytree(searched, cwd)
    return cwd


def run_as_printed(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`line` pasted into a shell, with this environment's `autofit` first on the PATH and the
    user's model importable."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    done = subprocess.run(
        ["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PATH": path, "PYTHONPATH": str(TESTS)},
    )  # fmt: skip
    assert done.returncode == 0, (line, done.stderr)
    return done


def summary(cwd: Path) -> dict:
    return json.loads((cwd / "results" / STUDY / "summary.json").read_text())


def assert_measures_the_best_run(cwd: Path) -> None:
    """The one probe result under results/probes/ is the study's best run, measured again (the
    same peak where it was simulated again: backend=auto simulates without a GPU to hold it)."""
    best = summary(cwd)["best"]
    (written,) = (cwd / "results" / "probes").glob("*.json")
    result = json.loads(written.read_text())
    assert result["outcome"] == "ok" and result["config"] == best["config"]
    if result["backend"] == "simulate":
        assert result["peak_bytes"] == best["peak_bytes"]


@pytest.mark.long
def test_the_rerun_line_rewrites_the_folder(workdir: Path) -> None:
    before = summary(workdir)
    rerun = before["rerun"]
    assert f"space={SPACE}" in shlex.split(rerun)
    shutil.rmtree(workdir / "results" / STUDY)
    run_as_printed(rerun, workdir)
    after = summary(workdir)
    assert after["reused_probes"] == before["n_probes"] and after["new_probes"] == 0
    assert after["best"]["config"] == before["best"]["config"] and after["rerun"] == rerun


@pytest.mark.long
def test_the_rerun_a_damaged_folder_names_rewrites_it(workdir: Path) -> None:
    trials = workdir / "results" / STUDY / "trials.csv"
    trials.write_text(trials.read_text()[:-5])  # the last row cut short
    refused = in_process("report", AS_TYPED, cwd=workdir)
    assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1
    rerun = refused.stderr.split("`")[1]
    assert f"space={SPACE}" in shlex.split(rerun)
    run_as_printed(rerun, workdir)
    assert in_process("report", AS_TYPED, cwd=workdir).returncode == 0


@pytest.mark.long
def test_the_best_runs_probe_line_measures_it(workdir: Path) -> None:
    header = (workdir / "results" / STUDY / "best.yaml").read_text().splitlines()[1]
    run_as_printed(header.removeprefix("# Re-measure it with: "), workdir)
    assert_measures_the_best_run(workdir)


@pytest.mark.long
def test_the_reports_export_line_and_the_exports_probe_line_run(workdir: Path) -> None:
    report = in_process("report", AS_TYPED, cwd=workdir)
    assert report.returncode == 0, report.stderr
    (line,) = [w for w in report.stdout.splitlines() if w.startswith("| export")]
    exported = run_as_printed(line.removeprefix("| export").strip(), workdir)
    assert f"exported best of {STUDY} for hydra to " in exported.stdout
    launch = exported.stdout.split("\nlaunch:\n")[1].strip()
    assert launch.startswith("autofit probe ")
    run_as_printed(launch, workdir)
    assert_measures_the_best_run(workdir)
