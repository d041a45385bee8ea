"""`autofit probe` end to end, and every kind of bad input as one line with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import autofit, in_process

from autofit.cli import COMMANDS
from autofit.knobs import registry

REQUIRED_FIELDS = {
    "outcome", "backend", "gpu", "config", "peak_bytes", "peak_allocated_bytes", "budget_bytes",
    "breakdown", "phase", "samples_per_s", "step_time_s", "flops_per_sample", "param_count",
    "trainable_param_count", "error", "versions",
}  # fmt: skip
BREAKDOWN = {"parameters", "gradients", "optimizer_state", "activations", "temporaries", "overhead"}


@pytest.mark.long
def test_the_sana_1600m_probe_from_the_issue(tmp_path: Path) -> None:
    done = autofit(
        "probe", "model=sana_1600m", "gpu=a40", "batch_size=1", "resolution=1024", "precision=bf16",
        "optimizer=adamw", "checkpointing=false", "out=result.json", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert REQUIRED_FIELDS <= set(result)
    assert result["outcome"] == "ok"
    assert result["backend"] == "simulate"  # picked by itself: no GPU here
    assert set(result["breakdown"]) == BREAKDOWN
    assert sum(result["breakdown"].values()) == result["peak_bytes"]
    assert result["peak_bytes"] <= result["budget_bytes"]
    assert result["phase"] in ("forward", "backward", "optimizer")
    assert abs(result["param_count"] / 1.604e9 - 1) < 0.01
    assert result["throughput_estimated"] is True
    asked = {
        "batch_size": 1,
        "resolution": 1024,
        "precision": "bf16",
        "checkpointing": False,
        "optimizer": "adamw",
    }
    assert {k: result["config"][k] for k in asked} == asked
    assert set(result["config"]) == set(registry())  # every knob as applied, defaults included
    assert "sana_1600m on a40 [simulate]: ok" in done.stdout


@pytest.mark.long
def test_not_fitting_is_an_answer(tmp_path: Path) -> None:
    # tiny_sana needs about 520 MiB: a 0.99 margin leaves an RTX 4090 about 230 MiB.
    done = in_process(
        "probe", "model=tiny_sana", "gpu=rtx4090", "margin=0.99", "out=r.json", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["outcome"] == "oom"
    assert result["peak_bytes"] > result["budget_bytes"]
    assert "does not fit" in done.stdout


def test_an_impossible_combination_is_invalid_with_the_reason(tmp_path: Path) -> None:
    done = in_process(
        "probe", "model=tiny_mlp", "gpu=v100_16", "precision=bf16", "out=r.json", cwd=tmp_path
    )
    assert done.returncode == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["outcome"] == "invalid"
    assert "bf16" in result["error"]["message"]


@pytest.mark.long
def test_default_output_goes_under_results(tmp_path: Path) -> None:
    done = autofit("probe", "model=tiny_mlp", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    written = list((tmp_path / "results" / "probes").glob("tiny_mlp-a40-b1-r64-*.json"))
    assert len(written) == 1


@pytest.mark.parametrize(
    "args,names",
    [
        (["model=sana_1600"], ["sana_1600", "sana_1600m", "tiny_mlp"]),
        (["gpu=a41"], ["a41", "a40", "rtx4090"]),
        (["optimizer=adam"], ["adam", "adamw", "sgd"]),
        (["precision=bf8"], ["bf8", "fp16", "bf16_pure"]),
        (["checkpointing=maybe"], ["maybe", "true", "false"]),
        (["batch_size=0"], ["batch_size=0", ">= 1"]),
        (["batch_size=two"], ["two", "integer"]),
        (["resolution=1000"], ["1000", "multiple of 32"]),
        (["backend=gpu"], ["gpu", "simulate", "cuda"]),
        (["optimzer=adamw"], ["optimzer", "optimizer"]),
        (["batch_size"], ["batch_size", "write batch_size=<value>"]),
        (["margin=1.5"], ["1.5", "fraction"]),
    ],
)
def test_bad_input_is_one_line_naming_the_value_and_the_valid_ones(
    tmp_path: Path, args: list[str], names: list[str]
) -> None:
    done = in_process("probe", *args, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    for name in names:
        assert name in lines[0]
    assert not (tmp_path / "results").exists()


def test_unknown_command(tmp_path: Path) -> None:
    done = in_process("prob", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"autofit: error: unknown command 'prob' (did you mean 'probe'?); valid commands: {', '.join(COMMANDS)}"
    )


def test_an_unwritable_output_fails_before_probing(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    done = in_process("probe", "model=tiny_mlp", "out=taken", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "cannot write the result to taken" in done.stderr


def test_help_lists_commands_and_knobs(tmp_path: Path) -> None:
    assert "probe" in in_process("--help", cwd=tmp_path).stdout
    knobs = in_process("probe", "--help", cwd=tmp_path).stdout
    for name in (
        "batch_size",
        "resolution",
        "precision",
        "optimizer",
        "checkpointing",
        "sana_1600m",
        "a40",
    ):
        assert name in knobs


def test_search_help_shows_the_target_settings_and_sweeps(tmp_path: Path) -> None:
    text = in_process("search", "--help", cwd=tmp_path).stdout
    lines = text.splitlines()
    assert lines[1].split() == ["autofit", "search", "-m", "key=a,b", "...", "(a", "sweep:", "one",
                                "run", "per", "combination", "of", "values)"]  # fmt: skip
    named = {line.split()[0] for line in lines if line.startswith("  ")}
    assert {"target.resolution", "target.min_batch", "margin", "space"} <= named
    assert "target" not in named and "defaults" not in named
    # a description that goes on under its setting in the YAML is read whole
    (host,) = [line for line in lines if line.split()[:1] == ["host_memory_gib"]]
    assert host.endswith(
        "default: this machine's RAM when probing the GPU here, else a typical machine's for the "
        "card (its entry's host_memory_gib; a card file without one: no limit)"
    )  # three lines of the YAML, read whole
    (grace,) = [line for line in lines if line.split()[:1] == ["claim_grace_s"]]
    assert "is taken over by another worker" in grace


@pytest.mark.long
def test_models_in_a_read_only_folder_prints_its_table_and_warns(tmp_path: Path) -> None:
    from helpers import read_only

    with read_only(tmp_path / "results"):
        done = autofit("models", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "sana_1600m" in done.stdout and "written to" not in done.stdout
    warning = done.stderr.strip()
    assert len(warning.splitlines()) == 1, warning
    assert warning.startswith("autofit: warning: the table is not written to results/models.json (")
    assert warning.endswith("add out=PATH to write it somewhere else")


def test_auto_on_a_machine_without_an_nvidia_device_simulates_without_importing_torch(
    tmp_path: Path,
) -> None:
    """Where no NVIDIA device is visible (CUDA_VISIBLE_DEVICES empty here; on Linux, no GPU
    under /proc/driver/nvidia/gpus), backend=auto is simulate, known without importing torch:
    a search's parent process never imports it."""
    import os
    import subprocess
    import sys

    from autofit.devices import nvidia_device_visible

    code = (
        "import sys\n"
        "from autofit.backends import resolve\n"
        "from autofit.gpus import load_gpu\n"
        "print(resolve('auto', load_gpu('a40'), 1), 'torch' in sys.modules)\n"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout.split() == ["simulate", "False"], done.stderr
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    empty = nvidia_device_visible(gpus)
    (gpus / "0000:01:00.0").mkdir()
    seen = nvidia_device_visible(gpus)
    if os.environ.get("CUDA_VISIBLE_DEVICES", "x").strip() not in ("", "-1"):
        assert (empty, seen) == (False, True)
