"""Every model preset: its parameter counts against the published figures, and one simulated
probe at batch 1 and its native size; and a user's own model through model=custom."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import autofit, in_process, spec, with_blocks

from autofit.commands.models import count_parameters
from autofit.paths import group_options
from autofit.probe.worker import execute
from autofit.records.probe import Outcome

PRESETS = [name for name in group_options("model") if name != "custom"]
TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def counts() -> dict[str, dict]:
    return {row["model"]: row for row in count_parameters()}


@pytest.mark.long
def test_parameter_counts_are_within_one_percent_of_the_published_figures(counts: dict) -> None:
    checked = 0
    for name, row in counts.items():
        if row["published_params_b"]:
            assert row["params"] / 1e9 == pytest.approx(row["published_params_b"], rel=0.01), name
            checked += 1
        for role, companion in row["companions"].items():
            if companion["published_params_b"]:
                assert companion["params"] / 1e9 == pytest.approx(
                    companion["published_params_b"], rel=0.01
                ), (name, role)
    # Sana 600M and 1600M, SD3 Medium, SD3.5 Medium and Large, Flux.1-dev, SDXL, Llama 3 8B, 3.2
    # 1B and 3B, 3.1 70B, Llama 2 7B and 70B, Mistral 7B v0.2, Yi 34B, Qwen2.5 7B, 14B and 32B,
    # Qwen3-30B-A3B, SD 1.5 and 2.1, PixArt-Sigma 1024 and 512, Chroma, Flux.1 [schnell], Wan
    # 2.2 TI2V 5B, FLUX.1 Kontext [dev]
    assert checked == 27


def _probe_at_batch_1(model: str, blocks: int | None) -> None:
    probe = spec(model, gpu="h200", backend="simulate")
    result = execute(with_blocks(probe, blocks) if blocks else probe)
    assert result.outcome in (Outcome.OK, Outcome.OOM), result.error
    assert result.peak_bytes > 0 and result.samples_per_s > 0 and result.flops_per_sample > 0
    assert result.trainable_param_count > 0
    assert sum(result.breakdown.values()) == result.peak_bytes
    if model in ("llama3_8b", "qwen2_5_7b"):
        assert result.units_per_sample == 4096
        assert result.tokens_per_s == pytest.approx(result.samples_per_s * 4096)


@pytest.mark.long
@pytest.mark.parametrize("model", PRESETS)
def test_every_preset_probes_at_batch_1_and_its_native_size_with_two_of_its_blocks(
    model: str,
) -> None:
    """Each preset's layer types, widths, inputs, buckets and loss through one simulated step at
    its native size, on two of its blocks (the full models are built by the parameter-count test
    above; their native-size searches run in benchmarks/preset_searches.py, and with every block
    under `pytest -m slow`)."""
    _probe_at_batch_1(model, 2)


@pytest.mark.slow
@pytest.mark.parametrize("model", PRESETS)
def test_every_preset_probes_at_batch_1_and_its_native_size(model: str) -> None:
    _probe_at_batch_1(model, None)


@pytest.mark.long
def test_a_users_own_model_probes_like_a_preset(tmp_path: Path) -> None:
    done = autofit(
        "probe",
        "model=custom",
        "model.entry=custom_models.tiny:build",
        "resolution=128",
        "out=r.json",
        cwd=tmp_path,
        pythonpath=TESTS,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["outcome"] == "ok"
    assert result["param_count"] == 64 * 256 + 256 + 256 * 64 + 64


@pytest.mark.parametrize(
    "entry,words",
    [
        ("custom_models.tiny", "package.module:function"),
        ("no_such_package.models:build", "no module 'no_such_package.models'"),
        ("custom_models.tiny:missing", "has no 'missing'"),
    ],
)
def test_a_bad_entry_is_one_line(tmp_path: Path, entry: str, words: str) -> None:
    done = in_process(
        "probe", "model=custom", f"model.entry={entry}", cwd=tmp_path, pythonpath=TESTS
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr


def test_an_entry_that_returns_something_else_is_one_line_before_any_probe(
    tmp_path: Path,
) -> None:
    done = in_process(
        "probe", "model=custom", "model.entry=custom_models.tiny:not_a_model", "out=r.json",
        cwd=tmp_path, pythonpath=TESTS,
    )  # fmt: skip
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "returned str, not a CustomModel" in done.stderr
    assert not (tmp_path / "r.json").exists()


def test_an_error_inside_the_users_module_is_one_line_naming_it(tmp_path: Path) -> None:
    (tmp_path / "broken_models.py").write_text("import no_such_library\n")
    done = in_process("probe", "model=custom", "model.entry=broken_models:build", cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert (
        "importing 'broken_models' failed: ModuleNotFoundError: No module named "
        "'no_such_library'" in done.stderr
    )


@pytest.mark.long
def test_the_documented_custom_model_works_as_printed(tmp_path: Path) -> None:
    """docs/models.md's module, saved where it says, and its probe command as printed, run by the
    installed `autofit` script in that folder (whose own directory, not the working one, is what
    Python puts on the path)."""
    readme = (TESTS.parent / "docs" / "models.md").read_text()
    code = re.search(r"```python\n# my_models/tiny.py\n(.*?)```", readme, re.S)
    assert code is not None
    (tmp_path / "my_models").mkdir()
    (tmp_path / "my_models" / "tiny.py").write_text(code.group(1))
    command = re.search(r"^autofit probe model=custom model\.entry=my_models\S* .*$", readme, re.M)
    assert command is not None
    script = Path(sys.executable).parent / "autofit"
    done = subprocess.run(
        [str(script), *command.group(0).split()[1:]], cwd=tmp_path, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (result,) = (tmp_path / "results" / "probes").glob("custom-*.json")
    assert json.loads(result.read_text())["outcome"] == "ok"


@pytest.mark.slow  # a 3 B model at 1024 px, twice (test_techniques holds the mechanism on small ones)
def test_sd3_controlnet_seed_case_training_fits_an_a100_80gb_and_its_validation_does_not() -> None:
    # diffusers' ControlNet SD3 example on its defaults (no mixed precision, batch 1, 1024 px):
    # diffusers issue #11225 reports training running and validation running out of memory.
    knobs = {"precision": "fp32", "batch_size": 1, "resolution": 1024}
    training = execute(spec("sd3_controlnet", gpu="a100_80", validation="off", **knobs))
    validation = execute(spec("sd3_controlnet", gpu="a100_80", validation="on", **knobs))
    assert training.outcome == Outcome.OK, training.error
    assert validation.outcome == Outcome.OOM and validation.phase == "validation"
    # the kept text encoders and the zeroed, not freed, gradients are part of what training holds
    assert training.breakdown["gradients"] > 0
    assert training.breakdown["parameters"] > 3.0e9 * 4
