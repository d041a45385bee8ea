"""base_precision=int8_quanto and fp8_quanto: SimpleTuner's quanto bases, optimum-quanto's own
`quantize` and `freeze` on fake tensors and on real ones on the CPU."""

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

INT8 = {"train_mode": "lora", "base_precision": "int8_quanto", "precision": "bf16_autocast"}
FP8 = {**INT8, "base_precision": "fp8_quanto"}


@pytest.mark.parametrize("base", [INT8, FP8], ids=["int8", "fp8"])
@pytest.mark.parametrize("knobs", [{}, EVERY], ids=["unchecked", "checkpointed"])
def test_fake_and_real_hold_the_same_bytes(base: dict[str, Any], knobs: dict[str, Any]) -> None:
    _, fake = simulate.trace(tiny_sd3(**base, **knobs))
    _, real = cpu.trace(tiny_sd3("cpu", **base, **knobs))
    assert fake.peak == real.peak
    assert fake.peak_report().breakdown == real.peak_report().breakdown


def test_each_quantized_weight_is_one_byte_and_a_scale_per_row() -> None:
    same_run, same = simulate.trace(tiny_sd3(**{**INT8, "base_precision": "same"}))
    run, log = simulate.trace(tiny_sd3(**INT8))
    quantized = [m for m in run.model.modules() if type(m).__name__ in ("QLinear", "QConv2d")]
    assert quantized
    saved = 0
    for module in quantized:
        rows = module.weight.shape[0]
        elements = module.weight.numel()
        # bf16 values become int8 ones and a bf16 scale per output row, each a block of its own,
        # and quanto's layer keeps a one-number input and output scale (for activations it does
        # not quantize here) beside them
        saved += round_allocation(elements * 2) - round_allocation(elements)
        saved -= round_allocation(rows * 2) + 2 * round_allocation(2)
    assert saved > 0
    assert same.live_bytes("parameters") - log.live_bytes("parameters") == saved


def test_every_quantized_layer_keeps_its_input_for_backward() -> None:
    """quanto's linear function saves its input whether or not its weight trains, where a frozen
    16-bit layer saves none of it: more activations, all of which checkpointing drops."""

    def activations(**knobs: Any) -> int:
        return simulate.trace(tiny_sd3(**knobs))[1].peak_report().breakdown["activations"]

    same = {**INT8, "base_precision": "same"}
    assert activations(**INT8) > activations(**same)
    assert activations(**INT8, **EVERY) < activations(**INT8) / 3


def test_simpletuner_keeps_its_excluded_layers_in_16_bits() -> None:
    run, _ = simulate.trace(tiny_sd3(**INT8))
    names = {name for name, m in run.model.named_modules() if type(m).__name__ == "QLinear"}
    assert names and not any("norm" in name or name == "proj_out" for name in names)
    assert any(name.endswith("attn.to_q.base_layer") for name in names)  # under PEFT's LoRA


def test_rules_and_words() -> None:
    config = {**defaults(), **INT8}
    gpu, preset = load_gpu("a40"), load_preset("sd35_medium")
    assert invalid_reason(config, gpu, preset, "simulate") is None
    swapped = invalid_reason({**config, "swap_blocks": 4}, gpu, preset, "simulate")
    assert swapped is not None and swapped.startswith("base_precision=int8_quanto with swap_blocks")
    subject = Subject(config, preset)
    knob = REGISTRY["base_precision"]
    for value, word in (("int8_quanto", "int8-quanto"), ("fp8_quanto", "fp8-quanto")):
        said = knob.express("simpletuner", value, subject)
        assert isinstance(said, Say) and said.settings == {"base_model_precision": word}
        for vocabulary in ("kohya", "diffusers"):
            assert isinstance(knob.express(vocabulary, value, subject), Refuse)
    # SimpleTuner has no plain float8 cast: its fp8 base is quanto's
    refused = knob.express("simpletuner", "fp8", subject)
    assert isinstance(refused, Refuse) and "fp8_quanto" in refused.offers
