"""The mistakes a newcomer makes, one test each, through the real command line: each is met with
one line naming the bad value (and the valid ones where there are some), a non-zero exit code and
no traceback."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from helpers import in_process

# Every saving on (pure bf16 weights, SGD's small state, checkpointing) at batch 1: the smallest
# run the space allows still needs more than a 2% slice of an L4.
NOTHING_FITS_SPACE = """
batch_size: {min: 1, max: 4}
resolution: [x1]
knobs:
  precision: [bf16_pure]
  optimizer: [sgd]
  checkpointing: [true]
"""


def error_line(done: subprocess.CompletedProcess[str], exit_code: int) -> str:
    """The one error line, after checking the exit code and that nothing else went wrong."""
    assert done.returncode == exit_code, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("autofit: error:")]
    assert len(errors) == 1, done.stderr
    assert done.stderr.rstrip().endswith(errors[0]), done.stderr  # the last word, nothing after it
    return errors[0]


def only_line(done: subprocess.CompletedProcess[str], exit_code: int) -> str:
    """For mistakes caught before anything runs: the error is all of stderr, on one line."""
    line = error_line(done, exit_code)
    assert done.stderr.strip() == line, done.stderr
    return line


def a_study(results: Path, name: str = "tiny_mlp-a40-quick") -> Path:
    """A results folder as `autofit search` leaves it, written by hand (one fitting probe)."""
    folder = results / name
    folder.mkdir(parents=True)
    config = {"batch_size": 1, "resolution": 64, "precision": "bf16", "optimizer": "adamw"}
    point = {"config": config, "peak_bytes": 500 << 20, "samples_per_s": 100.0,
             "step_time_s": 0.01, "run_size": 4096, "breakdown": {"overhead": 500 << 20}}  # fmt: skip
    summary = {"study": name, "model": "tiny_mlp", "gpu": "a40", "backend": "simulate",
               "space": "quick", "margin": 0.05, "budget_bytes": 1 << 30, "n_probes": 1,
               "best": point, "pareto": [point],
               "combinations": [{"knobs": {"precision": "bf16", "optimizer": "adamw"},
                                 "resolution": 64, "status": "exact", "best_batch": 1,
                                 "probes": 1, "reason": ""}]}  # fmt: skip
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "trials.csv").write_text(
        "outcome,resolution,batch_size,precision,optimizer,peak_gib,peak_bytes,budget_bytes,"
        "samples_per_s,step_time_s,phase,backend,reason\n"
        f"ok,64,1,bf16,adamw,0.488,{500 << 20},{1 << 30},100.0,0.01,backward,simulate,\n"
    )
    return folder


def test_a_typo_in_a_model_name(tmp_path: Path) -> None:
    line = only_line(in_process("search", "model=sana_1600", "gpu=a40", cwd=tmp_path), 2)
    assert "unknown model 'sana_1600'" in line and "did you mean 'sana_1600m'" in line
    assert "tiny_sana" in line  # and the valid ones


def test_a_family_name_alone_offers_its_members(tmp_path: Path) -> None:
    """`sana` is closest in spelling to `tiny_sana`, but the user means one of the Sana presets."""
    line = only_line(in_process("search", "model=sana", "gpu=a40", cwd=tmp_path), 2)
    assert "unknown model 'sana' (did you mean 'sana_1600m' or 'sana_600m'?)" in line
    line = only_line(in_process("search", "model=tiny_mlp", "gpu=a100", cwd=tmp_path), 2)
    assert "unknown gpu 'a100' (did you mean 'a100_40' or 'a100_80'?)" in line


def test_a_typo_in_a_gpu_name(tmp_path: Path) -> None:
    for command in ("search", "probe"):
        line = only_line(in_process(command, "model=tiny_mlp", "gpu=rtx4900", cwd=tmp_path), 2)
        assert (
            "unknown gpu 'rtx4900'" in line and "did you mean 'rtx4090'" in line and "a40" in line
        )


@pytest.mark.parametrize(
    "args,said",
    [
        (["batch_size=["], "malformed override 'batch_size=[': no viable alternative"),
        (["model=tiny_mlp gpu=a40"], "malformed override 'model=tiny_mlp gpu=a40': "),
        (["model"], "malformed override 'model'; write model=<value>"),
        # the forms other tools take
        (["--model=tiny_mlp"], "malformed override '--model=tiny_mlp'; write model=tiny_mlp"),
        (["--model", "tiny_mlp"], "malformed override '--model tiny_mlp'; write model=tiny_mlp"),
        (["model", "tiny_mlp"], "malformed override 'model tiny_mlp'; write model=tiny_mlp"),
        (["model=tiny_mlp", "-m"], "-m comes first, right after the command"),
    ],
)
def test_a_malformed_override_says_what_to_write(
    tmp_path: Path, args: list[str], said: str
) -> None:
    line = only_line(in_process("probe", *args, cwd=tmp_path), 2)
    assert line.startswith(f"autofit: error: {said}")


def test_several_values_without_m_say_to_add_it(tmp_path: Path) -> None:
    line = only_line(in_process("search", "model=tiny_mlp,sana_600m", "gpu=l4", cwd=tmp_path), 2)
    assert line == (
        "autofit: error: model=tiny_mlp,sana_600m lists several values; to run each, add -m: "
        "autofit search -m model=tiny_mlp,sana_600m gpu=l4"
    )
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    "storage,said",
    [
        ("studies.db", "storage=studies.db names no scheme; write storage=sqlite:///studies.db"),
        ("postgres://me@db/autofit", "write storage=postgresql://me@db/autofit"),
    ],
)
def test_a_storage_slip_says_what_to_write(tmp_path: Path, storage: str, said: str) -> None:
    line = only_line(
        in_process("search", "model=tiny_mlp", "gpu=l4", f"storage={storage}", cwd=tmp_path), 2
    )
    assert said in line
    assert not list(tmp_path.iterdir())  # no database file, no results folder


def test_a_yaml_slip_is_named_by_line_and_column(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text(
        "batch_size: {min: 1, max: 4\nknobs:\n  optimizer: [adamw]\n"
    )
    line = only_line(
        in_process("search", "model=tiny_mlp", "gpu=l4", "space=mine.yaml", cwd=tmp_path), 2
    )
    assert line == (
        "autofit: error: mine.yaml: not valid YAML at line 2, column 6: expected ',' or '}', "
        "but got ':'"
    )


def test_an_unknown_setting_or_command(tmp_path: Path) -> None:
    line = only_line(in_process("search", "batchsize=4", cwd=tmp_path), 2)
    assert "unknown setting 'batchsize'" in line and "margin" in line
    line = only_line(in_process("report", "threshhold=0.2", cwd=tmp_path), 2)
    assert "unknown setting 'threshhold'" in line and "did you mean 'threshold'" in line
    line = only_line(in_process("serch", cwd=tmp_path), 2)
    assert "unknown command 'serch' (did you mean 'search'?)" in line and "report" in line


def test_a_knob_value_it_cannot_take(tmp_path: Path) -> None:
    line = only_line(in_process("probe", "model=tiny_mlp", "precision=bf17", cwd=tmp_path), 2)
    assert "precision='bf17'" in line and "bf16_pure" in line
    line = only_line(in_process("report", "threshold=10", cwd=tmp_path), 2)
    assert "threshold=10" in line and "between 0 and 1" in line


def test_report_with_no_study_yet(tmp_path: Path) -> None:
    line = only_line(in_process("report", cwd=tmp_path), 1)
    assert "no study found under results/" in line and "autofit search" in line


def test_report_of_a_study_that_does_not_exist(tmp_path: Path) -> None:
    a_study(tmp_path / "results")
    line = only_line(in_process("report", "study=tiny_mlp-a40-quik", cwd=tmp_path), 2)
    assert (
        "study=tiny_mlp-a40-quik: no such study" in line and "studies: tiny_mlp-a40-quick" in line
    )
    line = only_line(in_process("report", "from=nowhere", cwd=tmp_path), 2)
    assert "from=nowhere: no such folder" in line
    (tmp_path / "not_a_study").mkdir()
    line = only_line(in_process("report", "from=not_a_study", cwd=tmp_path), 2)
    assert "not_a_study is not a study's results folder" in line


def test_compare_with_a_study_that_does_not_exist(tmp_path: Path) -> None:
    a_study(tmp_path / "results")
    line = only_line(in_process("report", "compare=last-night", cwd=tmp_path), 2)
    assert "compare=last-night: no such study" in line and "tiny_mlp-a40-quick" in line
    assert not (tmp_path / "results" / "tiny_mlp-a40-quick" / "report").exists()  # checked first


def test_a_results_folder_that_cannot_be_written(tmp_path: Path) -> None:
    # Under a regular file: no folder can be made there, even as root (chmod would not stop root).
    (tmp_path / "a_file").write_text("")
    a_study(tmp_path / "results")
    line = only_line(in_process("report", "out=a_file/report", cwd=tmp_path), 1)
    assert "cannot write the report to a_file/report" in line
    line = only_line(
        in_process(
            "search", "model=tiny_mlp", "gpu=a40", "space=quick", "out=a_file/sub", cwd=tmp_path
        ),
        1,
    )
    assert "a_file/sub" in line and "cannot write" in line
    line = only_line(
        in_process(
            "search",
            "model=tiny_mlp",
            "gpu=a40",
            "space=quick",
            "storage=sqlite:///a_file/studies.db",
            cwd=tmp_path,
        ),
        1,
    )
    assert "a_file/studies.db" in line
    line = only_line(
        in_process("probe", "model=tiny_mlp", "out=a_file/result.json", cwd=tmp_path), 1
    )
    assert "a_file/result.json" in line and "cannot write" in line


@pytest.mark.long
def test_a_space_where_nothing_fits_even_at_batch_1_with_every_saving_on(tmp_path: Path) -> None:
    (tmp_path / "tight.yaml").write_text(NOTHING_FITS_SPACE)
    done = in_process(
        "search", "model=tiny_mlp", "gpu=l4", "space=tight.yaml", "margin=0.98", cwd=tmp_path
    )
    line = error_line(done, 1)
    summary = json.loads((tmp_path / "results" / "tiny_mlp-l4-tight" / "summary.json").read_text())
    smallest, budget = summary["nothing_fits"]["smallest_peak_bytes"], summary["budget_bytes"]
    assert smallest > budget
    found = re.search(r"smallest peak found is ([\d.]+) MiB against a budget of ([\d.]+) MiB", line)
    assert found, line
    assert float(found[1]) == round(smallest / (1 << 20), 2) and float(found[2]) == round(
        budget / (1 << 20), 2
    )

    # The report of that study says the same, and exits 0: it is an answer, not an error.
    report = in_process("report", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert (
        f"nothing fits: the smallest peak found is {found[1]} MiB against a budget of {found[2]} MiB"
        in report.stdout
    )
    assert "none fit  batch 1: oom" in report.stdout
