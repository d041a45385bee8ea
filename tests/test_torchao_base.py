"""base_precision=fp8wo_torchao: SimpleTuner's fp8wo-torchao base, torchao's own Float8WeightOnly
code on fake tensors and on real ones on the CPU."""

from __future__ import annotations

from typing import Any

import pytest
from test_checkpoint_interval import EVERY, tiny_sd3

from autofit.backends import cpu, simulate
from autofit.gpus import load_gpu
from autofit.knobs import REGISTRY, defaults, invalid_reason
from autofit.knobs.base import Refuse, Say, Subject
from autofit.models import load_preset
from autofit.quantization import simpletuner_torchao_layer
from autofit.simulator.tracker import round_allocation

TORCHAO = {"train_mode": "lora", "base_precision": "fp8wo_torchao"}


@pytest.mark.parametrize("knobs", [{}, EVERY], ids=["unchecked", "checkpointed"])
def test_fake_and_real_hold_the_same_bytes(knobs: dict[str, Any]) -> None:
    _, fake = simulate.trace(tiny_sd3(**TORCHAO, **knobs))
    _, real = cpu.trace(tiny_sd3("cpu", **TORCHAO, **knobs))
    assert fake.peak == real.peak
    assert fake.peak_report().breakdown == real.peak_report().breakdown


def test_each_quantized_weight_is_one_byte_and_a_float_scale_per_row() -> None:
    same_run, same = simulate.trace(tiny_sd3(train_mode="lora"))
    _, log = simulate.trace(tiny_sd3(**TORCHAO))
    saved = 0
    for module in same_run.model.modules():
        if simpletuner_torchao_layer(module) and not module.weight.requires_grad:
            rows, columns = module.weight.shape
            # bf16 values become e4m3 ones and an fp32 scale per row, each a block of its own
            saved += round_allocation(rows * columns * 2)
            saved -= round_allocation(rows * columns) + round_allocation(rows * 4)
    assert saved > 0
    assert same.live_bytes("parameters") - log.live_bytes("parameters") == saved


def test_dequantized_weights_wait_for_backward_unless_checkpointed() -> None:
    """torchao dequantizes a weight for each matmul, and the matmul keeps the 16-bit copy for
    the input's gradient: without checkpointing every layer's copy is an activation."""
    unchecked = simulate.trace(tiny_sd3(**TORCHAO))[1].peak_report().breakdown["activations"]
    same = simulate.trace(tiny_sd3(train_mode="lora"))[1].peak_report().breakdown["activations"]
    assert unchecked > same


def test_rules_and_words() -> None:
    config = {**defaults(), **TORCHAO}
    gpu, preset = load_gpu("a40"), load_preset("sd35_medium")
    assert invalid_reason(config, gpu, preset, "simulate") is None
    swapped = invalid_reason({**config, "swap_blocks": 4}, gpu, preset, "simulate")
    assert swapped is not None and swapped.startswith(
        "base_precision=fp8wo_torchao with swap_blocks"
    )
    subject = Subject(config, preset)
    knob = REGISTRY["base_precision"]
    said = knob.express("simpletuner", "fp8wo_torchao", subject)
    assert isinstance(said, Say) and said.settings == {"base_model_precision": "fp8wo-torchao"}
    for vocabulary in ("kohya", "diffusers"):
        assert isinstance(knob.express(vocabulary, "fp8wo_torchao", subject), Refuse)
