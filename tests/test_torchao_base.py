"""base_precision=fp8wo_torchao and fp8_torchao: SimpleTuner's fp8wo-torchao and fp8-torchao
bases, torchao's own code on fake tensors and on real ones on the CPU (whose torch has float8
matmuls too)."""

from __future__ import annotations

from typing import Any

import pytest
from test_checkpoint_interval import EVERY, tiny_sd3

from autofit.backends import cpu, simulate
from autofit.gpus import load_gpu
from autofit.knobs import REGISTRY, defaults, invalid_reason
from autofit.knobs.base import Refuse, Say, Subject
from autofit.models import load_preset
from autofit.simulator.tracker import round_allocation
from autofit.techniques.quantization import simpletuner_torchao_layer

TORCHAO = {"train_mode": "lora", "base_precision": "fp8wo_torchao"}
DYNAMIC = {"train_mode": "lora", "base_precision": "fp8_torchao", "gpu": "h100_80"}


@pytest.mark.parametrize("base", [TORCHAO, DYNAMIC], ids=["fp8wo", "fp8"])
@pytest.mark.parametrize("knobs", [{}, EVERY], ids=["unchecked", "checkpointed"])
def test_fake_and_real_hold_the_same_bytes(base: dict[str, Any], knobs: dict[str, Any]) -> None:
    _, fake = simulate.trace(tiny_sd3(**base, **knobs))
    _, real = cpu.trace(tiny_sd3("cpu", **base, **knobs))
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


def test_float8_inputs_keep_their_quantization_for_backward() -> None:
    """fp8-torchao quantizes every layer's input, and autograd keeps what that quantization saves
    (the input, its absolute value, fp32 copies divided and clamped) until backward: a frozen
    16-bit layer keeps none of its input. Checkpointing drops them with the rest."""

    def activations(**knobs: Any) -> int:
        return simulate.trace(tiny_sd3(**knobs))[1].peak_report().breakdown["activations"]

    assert activations(**DYNAMIC) > 2 * activations(train_mode="lora")
    assert activations(**DYNAMIC, **EVERY) < activations(**DYNAMIC) / 3


def test_float8_matmuls_need_an_ada_or_hopper_gpu() -> None:
    config = {**defaults(), **DYNAMIC}
    del config["gpu"]
    preset = load_preset("sd35_medium")
    for card in ("h100_80", "l40s", "rtx4090"):
        assert invalid_reason(config, load_gpu(card), preset, "simulate") is None
    assert invalid_reason(config, load_gpu("a40"), preset, "simulate") == (
        "base_precision=fp8_torchao runs float8 matmuls, which need compute capability 8.9 or "
        f"more; {load_gpu('a40').display} has 8.6; use fp8wo_torchao"
    )
    said = REGISTRY["base_precision"].express("simpletuner", "fp8_torchao", Subject(config, preset))
    assert isinstance(said, Say) and said.settings == {"base_model_precision": "fp8-torchao"}


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
