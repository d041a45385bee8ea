"""Every way a command can end badly ends in one line and a non-zero exit, before anything is
stored: a custom model whose code ends or hangs its process (autofit/probe/entry_check.py),
backend=cuda where CUDA cannot run (autofit/backends/__init__.py `resolve`), and a results
folder holding a knob value this autofit does not know (autofit/results/read.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import autofit, in_process

TESTS = Path(__file__).parent
SANA = "sana_1600m-a40-default"  # a fixed study (tests/fixtures/export/)
PRECISIONS = "fp32, fp16, bf16, bf16_pure, bf16_autocast"


def only_line(done: subprocess.CompletedProcess[str], exit_code: int = 2) -> str:
    assert done.returncode == exit_code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


# -- a custom model whose code ends its process, or never returns ------------------------------

# entry function (tests/custom_models/endings.py) -> what the line says it did
ENDINGS = {
    "exits_at_once": "exits_at_once() ended its process with exit status 0 (as os._exit(0) does) "
    "instead of returning a CustomModel",
    "calls_sys_exit": "calls_sys_exit() called sys.exit(3) instead of returning a CustomModel",
    "is_killed": "is_killed() was killed by SIGKILL (the kernel's out-of-memory killer sends it) "
    "instead of returning a CustomModel",
    "never_returns": "never_returns() did not return within timeout_s=3 s",
}


@pytest.mark.long
@pytest.mark.parametrize("function", list(ENDINGS))
def test_a_custom_model_that_ends_or_hangs_its_process_is_one_line(
    tmp_path: Path, function: str
) -> None:
    """In a fresh interpreter: autofit itself must survive the user's code to say what it did."""
    entry = f"custom_models.endings:{function}"
    started = time.monotonic()
    done = autofit(
        "probe", "model=custom", f"model.entry={entry}", "timeout_s=3", "out=r.json",
        cwd=tmp_path, pythonpath=TESTS, timeout=120,
    )  # fmt: skip
    assert time.monotonic() - started < 60  # the interpreter's start, the check, 3 s at most
    line = only_line(done)
    assert line.startswith(f"autofit: error: model.entry={entry}: {ENDINGS[function]}"), line
    assert not (tmp_path / "r.json").exists()


def test_a_search_checks_a_custom_model_before_any_folder_or_study(tmp_path: Path) -> None:
    done = autofit(
        "search", "model=custom", "model.entry=custom_models.endings:calls_sys_exit", "gpu=l4",
        "space=quick", cwd=tmp_path, pythonpath=TESTS, timeout=120,
    )  # fmt: skip
    assert only_line(done).endswith(ENDINGS["calls_sys_exit"])
    assert done.stdout == "" and not (tmp_path / "results").exists()


# -- backend=cuda where CUDA cannot run --------------------------------------------------------


def _no_cuda_here() -> str:
    """What the refusal names on this machine once no device is visible: the build, or CUDA's
    own error."""
    if not torch.backends.cuda.is_built():
        return f"torch {torch.__version__} was built without CUDA"
    return "CUDA did not start ("


@pytest.mark.long
@pytest.mark.parametrize(
    "args",
    [
        ["search", "model=tiny_mlp", "gpu=a40", "space=quick", "backend=cuda", "study=s"],
        ["probe", "model=tiny_mlp", "gpu=a40", "backend=cuda"],
        ["probe", "model=tiny_mlp", "gpu=a40", "backend=cuda", "host_memory_gib=8"],
        ["calibrate", "gpu=a40", "measure=cuda"],
    ],
    ids=["search", "probe", "probe-host-budget", "calibrate"],
)
def test_backend_cuda_without_a_usable_device_is_refused_before_anything_is_stored(
    tmp_path: Path, args: list[str]
) -> None:
    """No device visible, on any machine: torch built without CUDA here, CUDA_VISIBLE_DEVICES
    hiding every GPU on a GPU machine."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-m", "autofit", *args], cwd=tmp_path, capture_output=True, text=True,
        timeout=120, env=env,
    )  # fmt: skip
    line = only_line(done)
    setting = "measure" if args[0] == "calibrate" else "backend"
    assert line.startswith(f"autofit: error: {setting}=cuda cannot run here: {_no_cuda_here()}")
    assert done.stdout == ""
    assert list(tmp_path.iterdir()) == []  # no results folder, no study storage, no probe file


@pytest.mark.cuda
def test_backend_cuda_for_a_card_larger_than_the_local_gpu_is_refused(tmp_path: Path) -> None:
    """The cuda backend emulates a smaller card by capping its memory, never a larger one."""
    from autofit.gpus import load_gpu
    from autofit.paths import group_options

    local = torch.cuda.get_device_properties(0)
    larger = next(
        g for g in group_options("gpu") if load_gpu(g).budget_bytes(0.05) > local.total_memory
    )
    line = only_line(
        in_process("probe", "model=tiny_mlp", f"gpu={larger}", "backend=cuda", cwd=tmp_path)
    )
    assert f"backend=cuda cannot run here: the local {local.name} has " in line
    assert f"budget of {load_gpu(larger).name}" in line
    assert list(tmp_path.iterdir()) == []


# -- a results folder holding what the knob registry does not know -------------------------------


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A folder with a fixed study under results/, for a test to edit by hand."""
    folder = tmp_path / "results" / SANA
    folder.mkdir(parents=True)
    shutil.copy(TESTS / "fixtures" / "export" / SANA / "summary.json", folder)
    return tmp_path


def _edit(workdir: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    path = workdir / "results" / SANA / "summary.json"
    summary = json.loads(path.read_text())
    change(summary)
    path.write_text(json.dumps(summary))


# What the line adds about where such a value comes from.
EDITED = " (the folder was edited by hand, or written by a newer autofit)"


def test_an_export_of_a_value_no_knob_takes_is_refused_naming_file_knob_and_value(
    workdir: Path,
) -> None:
    """A folder from before most knobs existed exports (they are absent: at their defaults);
    the same folder with a value no knob takes is refused, and nothing is written."""
    kept = ("batch_size", "resolution", "precision", "optimizer", "checkpointing")

    def older(summary: dict[str, Any]) -> None:
        for run in (summary["best"], *summary["pareto"]):
            run["config"] = {k: run["config"][k] for k in kept}

    _edit(workdir, older)
    export = ("export", "target=deepspeed", f"study={SANA}")
    assert in_process(*export, cwd=workdir).returncode == 0
    shutil.rmtree(workdir / "results" / SANA / "export")
    _edit(workdir, lambda s: s["best"]["config"].update(precision="int3"))
    line = only_line(in_process(*export, cwd=workdir))
    assert line == (
        f"autofit: error: results/{SANA}/summary.json: the best run: precision='int3' is not "
        f"valid; valid values: {PRECISIONS}{EDITED}"
    )
    assert not (workdir / "results" / SANA / "export").exists()


@pytest.mark.parametrize("args", [["report"], ["export", "target=hydra", "point=3"]])
def test_a_knob_this_autofit_does_not_know_is_refused(workdir: Path, args: list[str]) -> None:
    _edit(workdir, lambda s: s["pareto"][2]["config"].update(fp8="on"))
    line = only_line(in_process(*args, f"study={SANA}", cwd=workdir))
    assert line.startswith(
        f"autofit: error: results/{SANA}/summary.json: Pareto point 3: unknown knob 'fp8'; "
        "valid knobs: batch_size, resolution, frames, precision, "
    )
    assert line.endswith(EDITED)


def test_a_trials_row_with_a_value_no_knob_takes_is_refused_naming_its_line(
    workdir: Path,
) -> None:
    (workdir / "results" / SANA / "trials.csv").write_text(
        "outcome,resolution,batch_size,precision,optimizer,peak_gib,peak_bytes,samples_per_s\n"
        "ok,1024,8,bf16_pure,adamw,30.0,32212254720,2.5\n"
        "oom,1024,9,int3,adamw,50.0,53687091200,\n"
    )
    line = only_line(in_process("report", f"study={SANA}", cwd=workdir))
    assert line == (
        f"autofit: error: results/{SANA}/trials.csv: line 3: precision='int3' is not valid; "
        f"valid values: {PRECISIONS}{EDITED}"
    )
