"""base_precision=int8_sdnq: SimpleTuner's int8-sdnq base by SDNQ's own code, fake against real
on the CPU, its layout, and the trainers' words."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import spec, with_blocks

from autofit.backends import cpu, simulate
from autofit.gpus import load_gpu
from autofit.knobs import REGISTRY, defaults, invalid_reason
from autofit.knobs.base import Refuse, Say, Subject
from autofit.models import load_preset


def _probe(base: str, **knobs: Any) -> Any:
    # one block of SD3.5 Medium at its widths: layers large enough for SDNQ to quantize
    settings = {
        "batch_size": 1, "resolution": 256, "precision": "bf16_autocast",
        "optimizer": "adamw_bf16", "train_mode": "lora", "lora_rank": 16,
        "lora_targets": "attention", "base_precision": base, **knobs,
    }  # fmt: skip
    return with_blocks(spec("sd35_medium", gpu="h100_80", **settings), 1)


@pytest.mark.long
@pytest.mark.parametrize("base", ["int8_sdnq", "int8_sdnq_hadamard"])
def test_simulated_allocations_equal_real_ones(base: str) -> None:
    probe = _probe(base)
    _, fake = simulate.trace(probe)
    _, real = cpu.trace(probe)
    assert fake.sizes == real.sizes and fake.events == real.events
    assert fake.categories == real.categories
    assert fake.peak_report() == real.peak_report()


@pytest.mark.long
def test_the_base_is_int8_with_an_fp32_scale_per_32_weights() -> None:
    run, _ = simulate.trace(_probe("int8_sdnq"))
    quantized = [
        m.weight for m in run.model.modules()
        if hasattr(getattr(m, "weight", None), "__tensor_flatten__")
    ]  # fmt: skip
    assert len(quantized) >= 10
    for weight in quantized:
        names, _ = weight.__tensor_flatten__()
        inner = {name: getattr(weight, name) for name in names}
        assert inner["weight"].dtype == torch.int8 and inner["weight"].numel() == weight.numel()
        assert inner["scale"].dtype == torch.float32
        assert inner["scale"].numel() * 32 == weight.numel()
        assert not weight.requires_grad


def test_it_stores_a_lora_or_lycoris_base_and_simpletuner_says_it() -> None:
    config = {**defaults(), "train_mode": "lycoris", "base_precision": "int8_sdnq"}
    assert REGISTRY["base_precision"].applies(config, load_preset("sdxl"))
    full = {**defaults(), "train_mode": "full", "base_precision": "int8_sdnq"}
    reason = invalid_reason(full, load_gpu("rtx4090"), load_preset("sdxl"), "simulate")
    assert reason is not None and "has no frozen base" in reason
    subject = Subject({**defaults(), "train_mode": "lora"}, load_preset("sd35_medium"))
    plain = REGISTRY["base_precision"].express("simpletuner", "int8_sdnq", subject)
    assert isinstance(plain, Say) and plain.settings == {"base_model_precision": "int8-sdnq"}
    rotated = REGISTRY["base_precision"].express("simpletuner", "int8_sdnq_hadamard", subject)
    assert isinstance(rotated, Say)
    assert rotated.settings == {"base_model_precision": "int8-sdnq", "sdnq_use_hadamard": True}
    for vocabulary in ("kohya", "sana", "diffusers"):
        said = REGISTRY["base_precision"].express(vocabulary, "int8_sdnq", subject)
        assert isinstance(said, Refuse), vocabulary
