"""What autofit writes is whole or absent, what it reads back is checked, and a name is a name.

- A study's folder (summary.json, trials.csv, pareto.csv, best.yaml), a report and an export are
  written to temporaries and renamed into place together, the folder's commit marker last: a kill
  at any moment leaves no half file under a final name (autofit/paths.py write_together).
- `report` and `export` refuse a damaged folder (a cut trials.csv, a half summary.json, a missing
  file) in one line naming the file and the search that rewrites it; exit 1, no traceback.
- `study=` is a name, never a path; `hydra.*` overrides that change the environment or import
  code are refused like any unknown setting.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import in_process

from autofit.config import validate_overrides
from autofit.errors import ConfigError
from autofit.knobs import defaults, that_matter
from autofit.models import load_preset
from autofit.paths import write_together

# Two structures of tiny_mlp, each reported at its largest batch (2): two trials, and a real
# search takes a few seconds.
SPACE = "batch_size: {min: 1, max: 2}\nresolution: [x1]\nknobs:\n  precision: [bf16, bf16_pure]\n"
STUDY = "outputs"
RERUN = (
    "rerun `autofit search model=tiny_mlp gpu=a40 space=space.yaml jobs=1 backend=simulate "
    f"study={STUDY}` to rewrite results/{STUDY}/"
)


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working folder with one real study, searched once for the module."""
    cwd = tmp_path_factory.mktemp("outputs")
    (cwd / "space.yaml").write_text(SPACE)
    done = in_process("search", "model=tiny_mlp", "gpu=a40", "backend=simulate",
                      "space=space.yaml", f"study={STUDY}", "jobs=1", cwd=cwd)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return cwd


@pytest.fixture
def workdir(searched: Path, tmp_path: Path) -> Path:
    """A copy of the searched folder, for a test to damage."""
    cwd = tmp_path / "work"
    shutil.copytree(searched, cwd)
    return cwd


def one_line(done: subprocess.CompletedProcess[str], exit_code: int = 1) -> str:
    assert done.returncode == exit_code, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


# -- what a search writes ------------------------------------------------------------------------


@pytest.mark.long
def test_a_search_writes_its_files_whole_with_their_record_and_no_temporaries(
    searched: Path,
) -> None:
    folder = searched / "results" / STUDY
    assert sorted(p.name for p in folder.iterdir()) == [
        "best.yaml", "pareto.csv", "summary.json", "trials.csv",
    ]  # fmt: skip
    summary = json.loads((folder / "summary.json").read_text())
    trials = (folder / "trials.csv").read_text().splitlines()
    pareto = (folder / "pareto.csv").read_text().splitlines()
    assert summary["files"] == {
        "trials.csv": {"rows": len(trials) - 1},
        "pareto.csv": {"rows": len(pareto) - 1},
        "best.yaml": {},
    }
    assert len(trials) - 1 == 2  # the two reported points
    assert summary["rerun"] == RERUN.split("`")[1]
    # Written under the umask like any file, not mkstemp's 0600.
    mask = os.umask(0)
    os.umask(mask)
    assert (folder / "summary.json").stat().st_mode & 0o777 == 0o666 & ~mask


def test_the_report_of_the_whole_folder_passes(workdir: Path) -> None:
    done = in_process("report", f"study={STUDY}", cwd=workdir)
    assert done.returncode == 0, done.stderr
    report = workdir / "results" / STUDY / "report"
    assert sorted(p.name for p in report.iterdir()) == [
        "memory.png", "pareto.png", "report.html", "report.txt",
    ]  # fmt: skip


# -- a damaged folder ----------------------------------------------------------------------------


def _cut_at_a_row(folder: Path) -> None:
    lines = (folder / "trials.csv").read_text().splitlines(keepends=True)
    (folder / "trials.csv").write_text("".join(lines[:-1]))  # the last row gone, cleanly


def _cut_in_a_row(folder: Path) -> None:
    text = (folder / "trials.csv").read_text()
    (folder / "trials.csv").write_text(text[: len(text) - 20])


def _half_summary(folder: Path) -> None:
    text = (folder / "summary.json").read_text()
    (folder / "summary.json").write_text(text[: len(text) // 2])


DAMAGE = {
    # What today printed a report with exit 0: a trials.csv cut after a whole row.
    "trials cut at a row": (
        _cut_at_a_row,
        f"results/{STUDY}/trials.csv is damaged (1 rows where summary.json says 2 were written): "
        + RERUN,
    ),
    "trials cut in a row": (
        _cut_in_a_row,
        f"results/{STUDY}/trials.csv is damaged (its last row is cut short): " + RERUN,
    ),
    "trials missing": (
        lambda f: (f / "trials.csv").unlink(),
        f"results/{STUDY}/trials.csv is damaged (missing): " + RERUN,
    ),
    "pareto missing": (
        lambda f: (f / "pareto.csv").unlink(),
        f"results/{STUDY}/pareto.csv is damaged (missing): " + RERUN,
    ),
    "pareto cut": (
        lambda f: (f / "pareto.csv").write_text((f / "pareto.csv").read_text().splitlines()[0]),
        f"results/{STUDY}/pareto.csv is damaged (its last row is cut short): " + RERUN,
    ),
    "summary half": (
        _half_summary,
        f"results/{STUDY}/summary.json is damaged (not whole JSON: ",
    ),
    "summary missing": (
        lambda f: (f / "summary.json").unlink(),
        f"results/{STUDY}/summary.json is damaged (missing: the search that wrote the others "
        f"stopped): rerun the `autofit search` that wrote it (study={STUDY}, or "
        f"out=results/{STUDY}) to rewrite results/{STUDY}/",
    ),
}


@pytest.mark.parametrize("case", list(DAMAGE))
@pytest.mark.parametrize("command", ["report", "export"])
def test_a_damaged_folder_is_refused_in_one_line_naming_the_file_and_the_rerun(
    workdir: Path, case: str, command: str
) -> None:
    damage, expected = DAMAGE[case]
    damage(workdir / "results" / STUDY)
    args = [f"study={STUDY}"] + (["target=hydra"] if command == "export" else [])
    line = one_line(in_process(command, *args, cwd=workdir))
    assert line.startswith(f"autofit: error: {expected}"), line
    if case == "summary half":
        assert line.endswith(f"rerun the `autofit search` that wrote it (study={STUDY}, or "
                             f"out=results/{STUDY}) to rewrite results/{STUDY}/")  # fmt: skip
    assert not (workdir / "results" / STUDY / "report").exists()
    assert not (workdir / "results" / STUDY / "export").exists()


def test_a_summary_without_what_report_reads_is_damaged(workdir: Path) -> None:
    path = workdir / "results" / STUDY / "summary.json"
    summary = json.loads(path.read_text())
    del summary["combinations"]
    summary["budget_bytes"] = "lots"
    path.write_text(json.dumps(summary))
    line = one_line(in_process("report", f"from=results/{STUDY}", cwd=workdir))
    assert line == (
        f"autofit: error: results/{STUDY}/summary.json is damaged (no valid budget_bytes, "
        f"combinations): {RERUN}"
    )


def test_a_row_with_an_unknown_outcome_names_its_line(workdir: Path) -> None:
    path = workdir / "results" / STUDY / "trials.csv"
    path.write_text(path.read_text().replace("\nok,", "\nfits,", 1))
    line = one_line(in_process("report", f"study={STUDY}", cwd=workdir))
    assert line.startswith(
        f"autofit: error: results/{STUDY}/trials.csv is damaged (line 2: outcome 'fits' is none of "
    )
    assert line.endswith(RERUN)


# -- a kill in the middle of a write -------------------------------------------------------------

# A child that writes a set of files over an older set and is killed (SIGKILL, as by a scheduler)
# right after its first rename: what a kill at the worst moment leaves.
KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
import autofit.paths as paths

folder = Path(sys.argv[1])
renamed = []
real_replace = os.replace
def replace(source, target):
    real_replace(source, target)
    renamed.append(target)
    if len(renamed) == 1:
        os.kill(os.getpid(), signal.SIGKILL)
os.replace = replace
paths.write_together(folder, {name: (folder / name).read_text().replace("old", "new")
                              for name in ("trials.csv", "pareto.csv", "summary.json")},
                     marker="summary.json")
"""


def test_a_writer_killed_between_renames_leaves_whole_files_and_no_marker(
    workdir: Path,
) -> None:
    folder = workdir / "results" / STUDY
    before = {n: (folder / n).read_text() for n in ("trials.csv", "pareto.csv", "summary.json")}
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(folder)], cwd=workdir)
    assert killed.returncode == -signal.SIGKILL
    # summary.json went first (the marker is removed before any file is replaced): every file
    # left under a final name is one whole version of itself.
    assert not (folder / "summary.json").exists()
    for name in ("trials.csv", "pareto.csv"):
        text = (folder / name).read_text()
        assert text in (before[name], before[name].replace("old", "new"))
    line = one_line(in_process("report", f"study={STUDY}", cwd=workdir))
    assert line.startswith(f"autofit: error: results/{STUDY}/summary.json is damaged (missing")


def test_a_failed_write_leaves_the_older_set_and_no_temporaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_together(tmp_path, {"a.csv": "old a\n", "m.json": "old m\n"}, marker="m.json")

    def full_disk(*_: object) -> None:
        raise OSError(28, "No space left on device")

    # The second file's write fails (a full disk): nothing is renamed.
    import autofit.paths as paths

    real = paths._temporary
    calls = []

    def temporary(folder: Path, name: str, data: bytes) -> Path:
        calls.append(name)
        if len(calls) == 2:
            full_disk()
        return real(folder, name, data)

    monkeypatch.setattr(paths, "_temporary", temporary)
    with pytest.raises(OSError, match="No space left"):
        write_together(tmp_path, {"a.csv": "new a\n", "m.json": "new m\n"}, marker="m.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.csv", "m.json"]
    assert (tmp_path / "a.csv").read_text() == "old a\n"
    assert (tmp_path / "m.json").read_text() == "old m\n"


def test_an_export_and_a_report_replace_their_older_files_whole(workdir: Path) -> None:
    for _ in range(2):  # the second run replaces the first's files
        assert in_process("export", "target=hydra", cwd=workdir).returncode == 0
        assert in_process("report", cwd=workdir).returncode == 0
    export = workdir / "results" / STUDY / "export" / "hydra"
    report = workdir / "results" / STUDY / "report"
    assert sorted(p.name for p in export.iterdir()) == [
        "README.txt", "export.json", "overrides.yaml",
    ]  # fmt: skip
    assert sorted(p.name for p in report.iterdir()) == [
        "memory.png", "pareto.png", "report.html", "report.txt",
    ]  # fmt: skip
    assert json.loads((export / "export.json").read_text())["study"] == STUDY


# -- study= is a name ----------------------------------------------------------------------------

BAD_NAMES = {
    "../../x": "it holds a path separator",
    "a/b": "it holds a path separator",
    "..": "it starts with '.'",
    ".hidden": "it starts with '.'",
    "": "it is empty",
}


@pytest.mark.parametrize("name", list(BAD_NAMES))
@pytest.mark.parametrize("command", ["search", "report", "export"])
def test_a_study_that_is_not_a_name_is_refused_in_one_line(
    tmp_path: Path, name: str, command: str
) -> None:
    args = ["model=tiny_mlp", "gpu=a40", "backend=simulate"] if command == "search" else []
    line = one_line(in_process(command, f"study='{name}'", *args, cwd=tmp_path), 2)
    assert line == (
        f"autofit: error: study={name!r} is not a study name: {BAD_NAMES[name]}; a name is one "
        "folder under results/ (any characters but '/' and '\\', not starting with '.'); "
        "choose a folder with out=DIR"
    )
    assert sorted(p.name for p in tmp_path.rglob("*")) == []  # nothing written, anywhere


@pytest.mark.long
def test_a_study_name_with_a_space_and_shell_text_is_a_folder_under_results(
    tmp_path: Path,
) -> None:
    (tmp_path / "space.yaml").write_text(SPACE)
    name = "night run; $(touch INJECTED)"
    done = in_process("search", "model=tiny_mlp", "gpu=a40", "backend=simulate",
                      "space=space.yaml", f"study='{name}'", "jobs=1", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "results" / name / "summary.json").read_text())
    assert shlex.split(summary["rerun"])[-1] == f"study='{name}'"  # in Hydra's quotes too
    best = (tmp_path / "results" / name / "best.yaml").read_text().splitlines()[1]
    assert shlex.split(best.removeprefix("# Re-measure it with: "))[:4] == [
        "autofit", "probe", "model=tiny_mlp", "gpu=a40",
    ]  # fmt: skip
    assert in_process("report", f"study='{name}'", cwd=tmp_path).returncode == 0
    assert not list(tmp_path.rglob("INJECTED"))


# -- hydra settings ------------------------------------------------------------------------------

REFUSED = {
    "+hydra.job.env_set.PYTHONPATH=DIR": "it would change the environment or the code a run starts with",
    "++hydra.job.env_set.LD_PRELOAD=x.so": "it would change the environment or the code a run starts with",
    "hydra.job.env_copy=[AWS_SECRET]": "it would change the environment or the code a run starts with",
    "+hydra.callbacks.x._target_=any.module": "a _target_ names code for Hydra to import",
    "~hydra.callbacks": "it would change the environment or the code a run starts with",
    "hydra.launcher={_target_: any.Launcher}": "a _target_ names code for Hydra to import",
    "hydra.launcher._target_=any.Launcher": "a _target_ names code for Hydra to import",
    "+model._target_=os.system": "a _target_ names code for Hydra to import",
    "hydra.verbose=true": "autofit does not take it",
}
ALLOWED = [
    "hydra/launcher=basic",
    "hydra.launcher.n_jobs=2",
    "hydra.launcher.partition=gpu",
    "hydra.launcher.timeout_min=60",
    "hydra.launcher.cpus_per_task=4",
    "hydra.sweep.dir=sweeps/night",
    "hydra.sweep.subdir=${hydra.job.num}",
    "hydra.run.dir=runs/x",
]


@pytest.mark.parametrize("override", list(REFUSED))
def test_hydra_settings_that_change_the_environment_or_import_code_are_refused(
    tmp_path: Path, override: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        validate_overrides("search", ["model=tiny_mlp", override])
    key = override.split("=", 1)[0]
    assert str(refused.value) == (
        f"unknown setting '{key}' for 'autofit search' ({REFUSED[override]}); valid hydra "
        "settings: hydra/launcher=<name>, hydra.launcher.<setting>, hydra.sweep.dir, "
        "hydra.sweep.subdir, hydra.run.dir"
    )
    # The same line, before anything runs, in a plain command and in a -m sweep.
    for args in (["search"], ["search", "-m"]):
        line = one_line(in_process(*args, "model=tiny_mlp", override, cwd=tmp_path), 2)
        assert line == f"autofit: error: {refused.value}"
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("override", ALLOWED)
def test_the_hydra_settings_a_sweep_needs_pass(override: str) -> None:
    assert validate_overrides("search", ["model=tiny_mlp", "gpu=a40", override]) == [
        "model=tiny_mlp", "gpu=a40", override,
    ]  # fmt: skip


def test_a_damaged_copy_is_rewritten_where_it_now_is(workdir: Path) -> None:
    """A folder copied elsewhere: its search is rerun with out= naming the copy."""
    copy = workdir / "nightly copy"
    shutil.copytree(workdir / "results" / STUDY, copy)
    _cut_at_a_row(copy)
    line = one_line(in_process("report", f"from='{copy}'", cwd=workdir))
    command = line.split("`")[1]
    assert shlex.split(command)[-2:] == [f"study={STUDY}", f"out={copy}"]
    assert line.endswith(f"to rewrite {copy}/")


def test_the_knobs_that_matter_leave_out_those_of_other_train_modes() -> None:
    """What best.yaml lists: a full fine-tune names no adapter knob, LoRA its rank and targets,
    train_mode=peft its config file and not LoRA's rank."""
    llama = load_preset("llama3_2_3b")
    adapter_knobs = {"lora_rank", "lora_targets", "peft_config", "trainable_layers"}
    full = that_matter({**defaults(), "train_mode": "full"}, llama)
    assert not adapter_knobs & set(full) and {"batch_size", "checkpointing"} <= set(full)
    lora = that_matter({**defaults(), "train_mode": "lora"}, llama)
    assert adapter_knobs & set(lora) == {"lora_rank", "lora_targets"}
    peft = that_matter({**defaults(), "train_mode": "peft", "peft_config": "ia3.json"}, llama)
    assert adapter_knobs & set(peft) == {"peft_config"}
