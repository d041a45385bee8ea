"""train_mode=peft: any PEFT method from its adapter config, built by PEFT's own code. The same
allocations on fake tensors as on real ones; the methods the simulator refuses are the ones whose
PEFT code reads tensor values (checked against PEFT, so a method that starts to trace is seen);
each bad config a one-line reason; and the published PEFT rows as PEFT counts them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import spec, tiny_llama
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

from autofit.backends import cpu, simulate
from autofit.calibration.published import load_published
from autofit.errors import ConfigError
from autofit.gpus import load_gpu
from autofit.knobs import REGISTRY, defaults, invalid_reason
from autofit.knobs.base import Refuse, Subject
from autofit.knobs.peft_config import NEEDS_VALUES, SPARSE
from autofit.models import load_preset

QV = ["q_proj", "v_proj"]
# Small configs of the methods the simulator runs: tuners, shared state (VeRA), virtual tokens,
# and LoHa and LoKr, whose module dropout is a real draw on every forward.
TRACED = {
    "LOHA": {"r": 4, "target_modules": QV},
    "LOKR": {"r": 4, "target_modules": QV},
    "IA3": {},
    "VERA": {"r": 8},
    "OFT": {"r": 0, "oft_block_size": 16, "target_modules": QV},
    "FOURIERFT": {"n_frequency": 16, "target_modules": QV},
    "LN_TUNING": {},
    "PROMPT_TUNING": {"task_type": "CAUSAL_LM", "num_virtual_tokens": 4},
    "PREFIX_TUNING": {"task_type": "CAUSAL_LM", "num_virtual_tokens": 4},
}
# Small configs of the methods it refuses, as far as the tiny model lets them be built.
UNTRACED = {
    "BOFT": {"boft_block_size": 4, "target_modules": QV},
    "WAVEFT": {"n_frequency": 16, "target_modules": QV},
    "UNILORA": {"r": 4, "target_modules": QV},
    "VBLORA": {"r": 4, "num_vectors": 16, "vector_length": 16, "target_modules": QV},
    "SHIRA": {"r": 4, "target_modules": QV},
    "FROD": {"target_modules": QV},
}
GPU = load_gpu("l40s")


def _config(folder: Path, method: str, fields: dict[str, Any]) -> str:
    path = folder / f"{method.lower()}.json"
    path.write_text(json.dumps({"peft_type": method, **fields}))
    return str(path)


@pytest.mark.parametrize("method", TRACED)
def test_peft_methods_allocate_on_fake_tensors_what_they_allocate_for_real(
    method: str, tmp_path: Path
) -> None:
    probe = tiny_llama(train_mode="peft", peft_config=_config(tmp_path, method, TRACED[method]))
    fake_run, fake = simulate.trace(probe)
    real_run, real = cpu.trace(probe)
    assert fake.sizes == real.sizes
    assert fake.categories == real.categories
    assert fake.peak_report() == real.peak_report()
    assert fake_run.trainable_param_count == real_run.trainable_param_count > 0


def test_the_methods_the_simulator_refuses_are_the_ones_fake_tensors_cannot_run(
    tmp_path: Path,
) -> None:
    """Every method refused for reading tensor values fails on fake tensors for that reason (the
    list stays true as PEFT changes); each runs on the cpu backend but those that build sparse
    tensors, which are refused everywhere. AdaMSS needs scikit-learn to be built at all."""
    assert set(UNTRACED) | {"ADAMSS"} == set(NEEDS_VALUES)
    for method, fields in UNTRACED.items():
        probe = tiny_llama(train_mode="peft", peft_config=_config(tmp_path, method, fields))
        with pytest.raises((DataDependentOutputException, DynamicOutputShapeException)):
            simulate.trace(probe)
        if method in SPARSE:
            with pytest.raises(NotImplementedError, match="storage of SparseTensorImpl"):
                cpu.trace(probe)
        else:
            _, real = cpu.trace(probe)
            assert real.peak > 0


def _reason(backend: str = "simulate", **knobs: Any) -> str | None:
    config = {**defaults(), "train_mode": "peft", **knobs}
    return invalid_reason(config, GPU, load_preset("llama3_2_3b"), backend)


def test_a_config_without_targets_is_refused_for_a_model_peft_has_no_defaults_for(
    tmp_path: Path,
) -> None:
    """PEFT takes a method's default target modules from a transformers model's type: a config
    that names none runs a language model, and is refused, naming the fix, for any other."""
    untargeted = _config(tmp_path, "LORA", {"r": 8})
    config = {**defaults(), "train_mode": "peft", "peft_config": untargeted}
    assert invalid_reason(config, GPU, load_preset("llama3_2_3b"), "simulate") is None
    assert invalid_reason(config, GPU, load_preset("flux_dev"), "simulate") == (
        f"peft_config={untargeted} names no target_modules, so PEFT takes its defaults for a "
        "transformers language model's type; flux_dev is a flux model: name its target_modules "
        "in the file"
    )
    (tmp_path / "targeted").mkdir()
    targeted = _config(tmp_path / "targeted", "LORA", {"r": 8, "target_modules": ["to_q", "to_v"]})
    config["peft_config"] = targeted
    assert invalid_reason(config, GPU, load_preset("flux_dev"), "simulate") is None


def test_each_bad_peft_config_is_one_line_naming_it(tmp_path: Path) -> None:
    assert _reason() == (
        "train_mode=peft trains the adapters a PEFT config declares: give it as "
        "peft_config=path/to/adapter_config.json"
    )
    missing = str(tmp_path / "nothere.json")
    assert _reason(peft_config=missing).startswith(f"peft_config={missing}: no such file")
    broken = tmp_path / "broken.json"
    broken.write_text("{r: 8")
    assert _reason(peft_config=str(broken)).startswith(f"peft_config={broken}: not a JSON file")
    unnamed = tmp_path / "unnamed.json"
    unnamed.write_text('{"r": 8}')
    assert "names its method in a 'peft_type' field" in _reason(peft_config=str(unnamed))
    boft = _config(tmp_path, "BOFT", {})
    assert _reason(peft_config=boft) == (
        f"peft_config={boft}: PEFT's BOFT builds its butterfly permutation matrices by indexing "
        "with tensor values, which the simulator's fake tensors do not hold; probe it with "
        "backend=cpu or cuda"
    )
    assert _reason("cpu", peft_config=boft) is None
    # LoHa's module dropout makes a step's adapters chance: simulated only without it.
    assert _reason(peft_config=_config(tmp_path, "LOHA", {})) is None
    loha = _config(tmp_path, "LOHA", {"module_dropout": 0.1})
    assert _reason(peft_config=loha) == (
        f"peft_config={loha}: PEFT's LOHA with module_dropout=0.1 skips each adapter on a draw "
        "every forward, so which adapters a step runs is chance; the simulator takes "
        "module_dropout=0 (a full step); probe it with backend=cpu or cuda"
    )
    assert _reason("cpu", peft_config=loha) is None
    shira = _config(tmp_path, "SHIRA", {})
    assert "builds sparse tensors" in _reason("cpu", peft_config=shira)
    # A folder PEFT saved an adapter into stands for its adapter_config.json.
    (tmp_path / "saved").mkdir()
    _config(tmp_path / "saved", "IA3", {})
    (tmp_path / "saved" / "ia3.json").rename(tmp_path / "saved" / "adapter_config.json")
    assert _reason(peft_config=str(tmp_path / "saved")) is None
    for reason in (_reason(), _reason(peft_config=missing), _reason(peft_config=boft)):
        assert "\n" not in reason  # type: ignore[operator]
    # Outside train_mode=peft the file is never read.
    assert _reason(train_mode="lora", peft_config=missing) is None


def test_an_unknown_method_is_refused_naming_peft_s_methods(tmp_path: Path) -> None:
    probe = tiny_llama(train_mode="peft", peft_config=_config(tmp_path, "NOT_A_METHOD", {}))
    with pytest.raises(ConfigError, match=r"'NOT_A_METHOD' is not a method .* valid: .*IA3"):
        cpu.trace(probe)


def test_no_export_target_takes_a_peft_config(tmp_path: Path) -> None:
    """The trainers autofit exports to build their own networks: each refuses the value and the
    file, with its reason."""
    config = {**defaults(), "train_mode": "peft", "peft_config": _config(tmp_path, "IA3", {})}
    for model in ("llama3_2_3b", "flux_dev", "sana_1600m"):
        subject = Subject(config, load_preset(model))
        for vocabulary in ("simpletuner", "kohya", "diffusers", "sana"):
            for knob in ("train_mode", "peft_config"):
                said = REGISTRY[knob].express(vocabulary, config[knob], subject)
                assert isinstance(said, Refuse), (model, vocabulary, knob)
            file = REGISTRY["peft_config"].express(vocabulary, config["peft_config"], subject)
            assert "PEFT config file" in file.why  # type: ignore[union-attr]


def _trainable(row_lora: str) -> int:
    return int(re.search(r"\(([\d,]+) trainable\)", row_lora).group(1).replace(",", ""))  # type: ignore[union-attr]


@pytest.mark.long
def test_peft_builds_the_published_runs_trainable_parameters() -> None:
    """PEFT's benchmark states each run's trainable parameter count; PEFT's code on fake tensors
    builds the same count on the full Llama 3.2 3B for every row the simulator runs. One count
    differs by what the installed PEFT does differently from the benchmark's: peft 0.21's upcast
    reassigns AdaLoRA's one-value `ranknum` through its ParameterDict, which makes it trainable
    (one per adapted layer, 56 here); peft 0.19 cast it in place."""
    rows = [r for r in load_published() if r.id.startswith("N-PFN") and r.expressible]
    assert len(rows) >= 39
    for row in rows:
        probe = spec(row.model, row.gpu, **{**row.knobs, "batch_size": 1, "resolution": 16})
        run = simulate.built(probe)
        ranknums = sum(1 for name, _ in run.model.named_parameters() if ".ranknum." in name)
        assert ranknums == (56 if row.id == "N-PFN1" else 0)
        stated = _trainable(row.settings["lora"])
        assert run.trainable_param_count == stated + ranknums, row.id


def test_adapter_dtype_model_keeps_the_adapters_in_the_models_dtype(tmp_path: Path) -> None:
    """get_peft_model(autocast_adapter_dtype=False): bf16 adapters on a bf16 model, half the
    bytes of PEFT's default fp32 ones, and no fp32 input casts; fake as real on the CPU."""
    lora = _config(tmp_path, "LORA", {"r": 8, "target_modules": QV})
    logs = {}
    for dtype in ("fp32", "model"):
        probe = tiny_llama(
            train_mode="peft", peft_config=lora, precision="bf16_pure", adapter_dtype=dtype
        )
        fake_run, fake = simulate.trace(probe)
        _, real = cpu.trace(probe)
        assert fake.peak_report() == real.peak_report()
        trained = [p for p in fake_run.model.parameters() if p.requires_grad]
        assert {str(p.dtype) for p in trained} == {
            "torch.float32" if dtype == "fp32" else "torch.bfloat16"
        }
        logs[dtype] = fake.peak_report().breakdown
    assert logs["model"]["optimizer_state"] < logs["fp32"]["optimizer_state"]
    assert logs["model"]["activations"] < logs["fp32"]["activations"]
    assert _reason(adapter_dtype="model", train_mode="lora") == (
        "adapter_dtype=model is get_peft_model's autocast_adapter_dtype, for train_mode=peft; "
        "train_mode=lora builds its adapters in the dtype precision sets"
    )


def test_lorafa_freezes_the_a_factors_and_keeps_state_for_b_only(tmp_path: Path) -> None:
    """optimizer=lorafa is PEFT's create_lorafa_optimizer: lora_A frozen (no gradient, no state,
    no input kept for it), lora_B trained by its LoraFAOptimizer; fake as real on the CPU."""
    lora = _config(tmp_path, "LORA", {"r": 8, "lora_alpha": 16, "target_modules": QV})
    logs, runs = {}, {}
    for optimizer in ("adamw", "lorafa"):
        probe = tiny_llama(
            train_mode="peft", peft_config=lora, precision="bf16_pure", optimizer=optimizer
        )
        runs[optimizer], fake = simulate.trace(probe)
        _, real = cpu.trace(probe)
        assert fake.peak_report() == real.peak_report()
        logs[optimizer] = fake.peak_report().breakdown
    trained = [n for n, p in runs["lorafa"].model.named_parameters() if p.requires_grad]
    assert trained and all(".lora_B." in name for name in trained)
    assert logs["lorafa"]["optimizer_state"] < logs["adamw"]["optimizer_state"]
    assert logs["lorafa"]["activations"] < logs["adamw"]["activations"]
    assert _reason(optimizer="lorafa", train_mode="lora") is not None
    assert _reason(optimizer="lorafa", peft_config=_config(tmp_path, "IA3", {})) == (
        "optimizer=lorafa trains the B factors of LoRA adapters: peft_config must be a LoRA "
        "config (peft_type LORA)"
    )


def test_lorafa_is_a_pass_of_its_own(tmp_path: Path) -> None:
    """A search assembles runs that differ only in their update rule from one pass; LoRA-FA
    freezes the A factors, so its pass is its own."""
    from autofit.fastpath.scan import same_pass

    lora = _config(tmp_path, "LORA", {"r": 8, "target_modules": QV})

    def probe(optimizer: str) -> Any:
        return tiny_llama(train_mode="peft", peft_config=lora, optimizer=optimizer)

    assert same_pass(probe("adamw"), probe("adamw8bit"))
    assert not same_pass(probe("adamw"), probe("lorafa"))
