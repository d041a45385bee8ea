"""train_mode=lycoris: SimpleTuner's LyCORIS networks built by the lycoris-lora library, fake
against real on the CPU, its kernel choice as the target GPU makes it, and its refusals."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import spec

from autofit.backends import cpu, simulate
from autofit.gpus import load_gpu
from autofit.knobs import REGISTRY, defaults, invalid_reason
from autofit.knobs.base import Refuse, Say, Subject
from autofit.models import load_preset
from autofit.paths import calibration_dir

# SimpleTuner's sana.lycoris-lokr settings as the published rows state them (bypass mode, a full
# second factor, factor 2 on attention and 4 on feed-forward modules).
SANA_LOKR = str(calibration_dir() / "lycoris" / "sana-lokr-full-factor2-attention-4-ffn.json")


def _probe(gpu: str = "a40", **knobs: Any) -> Any:
    knobs = {"batch_size": 2, "precision": "bf16", "train_mode": "lycoris", **knobs}
    return spec("tiny_sana", gpu=gpu, lycoris_config=SANA_LOKR, **knobs)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_simulated_allocations_equal_real_ones_on_lycoris_reference_path(
    checkpointing: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the library's torch reference on both sides (what a CPU runs), fake tensors
    allocate what real ones do, to the byte and in order."""
    monkeypatch.setenv("LYCORIS_KERNEL_BACKEND", "torch")
    probe = _probe(checkpointing=checkpointing)
    run, fake = simulate.trace(probe)
    _, real = cpu.trace(probe)
    assert fake.sizes == real.sizes and fake.events == real.events
    assert fake.categories == real.categories
    assert fake.peak_report() == real.peak_report()
    # the network's factors are the only trainable parameters, in the model's dtype
    network = run.model.lycoris_network
    assert run.trainable_parameters() == list(network.parameters())
    assert {p.dtype for p in network.parameters()} == {run.dtypes.weights}


@pytest.mark.parametrize("checkpointing", [False, True])
def test_an_ampere_target_runs_the_fused_kernels_an_older_one_the_reference(
    checkpointing: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """lycoris' fused LoKr kernel keeps the layer's input and the factors for backward, where
    its torch reference also keeps an intermediate product per layer; a pre-Ampere GPU runs the
    reference (Triton has no bf16 tensor-core dots there). Also when checkpointing recomputes."""

    def activations(gpu: str, precision: str, reference: bool) -> int:
        if reference:
            monkeypatch.setenv("LYCORIS_KERNEL_BACKEND", "torch")
        else:
            monkeypatch.delenv("LYCORIS_KERNEL_BACKEND", raising=False)
        _, tracker = simulate.trace(_probe(gpu, precision=precision, checkpointing=checkpointing))
        return tracker.peak_report().breakdown["activations"]

    assert activations("a40", "bf16", reference=False) < activations("a40", "bf16", True)
    assert activations("t4", "fp16", reference=False) == activations("t4", "fp16", True)


def test_a_build_leaves_lycoris_presets_as_it_found_them() -> None:
    from lycoris import LycorisNetwork

    before = list(LycorisNetwork.TARGET_REPLACE_MODULE), dict(LycorisNetwork.MODULE_ALGO_MAP)
    simulate.trace(_probe())
    assert (
        list(LycorisNetwork.TARGET_REPLACE_MODULE),
        dict(LycorisNetwork.MODULE_ALGO_MAP),
    ) == before


def _reason(backend: str = "simulate", **knobs: Any) -> str | None:
    config = {**defaults(), "train_mode": "lycoris", **knobs}
    return invalid_reason(config, load_gpu("a40"), load_preset("sdxl"), backend)


def test_each_bad_lycoris_config_is_one_line_naming_it(tmp_path: Path) -> None:
    assert _reason() == (
        "train_mode=lycoris trains the network a LyCORIS config declares: give it as "
        "lycoris_config=path/to/lycoris_config.json"
    )
    missing = str(tmp_path / "nothere.json")
    assert _reason(lycoris_config=missing).startswith(f"lycoris_config={missing}: no such file")
    broken = tmp_path / "broken.json"
    broken.write_text("{algo: lokr")
    assert _reason(lycoris_config=str(broken)).startswith(f"lycoris_config={broken}: not a JSON")
    short = tmp_path / "short.json"
    short.write_text(json.dumps({"algo": "lokr", "multiplier": 1.0}))
    assert "names linear_dim, linear_alpha" in _reason(lycoris_config=str(short))  # type: ignore[operator]
    dropping = tmp_path / "dropping.json"
    fields = {"algo": "lokr", "multiplier": 1, "linear_dim": 4, "linear_alpha": 1}
    dropping.write_text(json.dumps({**fields, "module_dropout": 0.1}))
    assert "module_dropout draws a random number" in _reason(lycoris_config=str(dropping))  # type: ignore[operator]
    assert _reason("cpu", lycoris_config=str(dropping)) is None
    assert _reason(lycoris_config=SANA_LOKR) is None
    # Outside train_mode=lycoris the file is never read.
    assert _reason(train_mode="lora", lycoris_config=missing) is None


def test_a_config_that_adapts_nothing_is_refused_naming_the_model(tmp_path: Path) -> None:
    from autofit.errors import ConfigError

    nothing = tmp_path / "nothing.json"
    nothing.write_text(json.dumps({
        "algo": "lokr", "multiplier": 1, "linear_dim": 4, "linear_alpha": 1,
        "apply_preset": {"target_module": ["NoSuchBlock"]},
    }))  # fmt: skip
    with pytest.raises(ConfigError, match="adapts no layer of tiny_sana"):
        simulate.trace(spec("tiny_sana", train_mode="lycoris", lycoris_config=str(nothing)))


def test_simpletuner_reads_the_config_and_the_others_refuse_it() -> None:
    config = {**defaults(), "train_mode": "lycoris", "lycoris_config": SANA_LOKR}
    subject = Subject(config, load_preset("sana_1600m"))
    mode = REGISTRY["train_mode"].express("simpletuner", "lycoris", subject)
    assert isinstance(mode, Say) and mode.settings == {"model_type": "lora", "lora_type": "lycoris"}
    file = REGISTRY["lycoris_config"].express("simpletuner", SANA_LOKR, subject)
    assert isinstance(file, Say) and file.settings == {"lycoris_config": SANA_LOKR}
    assert Path(file.settings["lycoris_config"]).is_absolute()
    for vocabulary in ("kohya", "diffusers", "sana", "trl"):
        for knob in ("train_mode", "lycoris_config"):
            said = REGISTRY[knob].express(vocabulary, config[knob], subject)
            assert isinstance(said, Refuse), (vocabulary, knob)
