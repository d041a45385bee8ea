"""encoders=text (latents cached, the text encoders on the GPU encoding every step) and
t5_precision (the T5 encoder quantized by optimum-quanto), on fake tensors and on real ones on the
CPU, on SD3.5 Medium's blocks and encoders at toy widths."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from helpers import refusal
from test_checkpoint_interval import tiny_sd3

from autofit.backends import cpu, simulate
from autofit.knobs import REGISTRY, defaults
from autofit.knobs.base import Refuse, Say, Subject
from autofit.models import load_preset
from autofit.simulator.tracker import round_allocation

LORA = {"train_mode": "lora", "precision": "bf16_autocast", "checkpointing": True}


def _tiny(backend: str = "simulate", **knobs: Any):
    """tiny_sd3 with encoders of width 16 (CLIP-L and CLIP-G) and 64 (T5, two layers)."""
    probe = tiny_sd3(backend, **{**LORA, **knobs})
    model = copy.deepcopy(probe.model)
    for name in ("text_encoder", "text_encoder_2"):
        model["companions"][name]["architecture"].update(
            hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            projection_dim=16,
        )  # fmt: skip
    model["companions"]["text_encoder_3"]["architecture"].update(
        d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4
    )
    return dataclasses.replace(probe, model=model)


@pytest.mark.parametrize("t5", ["same", "fp8_quanto", "int8_quanto"])
def test_fake_and_real_hold_the_same_bytes(t5: str) -> None:
    _, fake = simulate.trace(_tiny(encoders="text", t5_precision=t5))
    _, real = cpu.trace(_tiny("cpu", encoders="text", t5_precision=t5))
    assert fake.peak == real.peak
    assert fake.peak_report().breakdown == real.peak_report().breakdown


def test_text_holds_the_text_encoders_and_not_the_vae() -> None:
    text_run, _ = simulate.trace(_tiny(encoders="text"))
    online_run, _ = simulate.trace(_tiny(encoders="online"))
    cached_run, _ = simulate.trace(_tiny())
    assert set(text_run.companions) == {"text_encoder", "text_encoder_2", "text_encoder_3"}
    assert set(online_run.companions) == set(text_run.companions) | {"vae"}
    assert not cached_run.companions


def test_the_quantized_t5_keeps_a_byte_a_weight_and_a_scale_per_row() -> None:
    same_run, same = simulate.trace(_tiny(encoders="text"))
    _, quantized = simulate.trace(_tiny(encoders="text", t5_precision="int8_quanto"))
    saved = 0
    for module in same_run.companions["text_encoder_3"].modules():
        if type(module).__name__ == "Linear":
            rows, columns = module.weight.shape
            # bf16 values to int8 ones, a bf16 scale per row and quanto's two one-number scales
            saved += round_allocation(rows * columns * 2) - round_allocation(rows * columns)
            saved -= round_allocation(rows * 2) + 2 * round_allocation(2)
    assert saved > 0
    assert same.live_bytes("parameters") - quantized.live_bytes("parameters") == saved


def test_rules_and_words() -> None:
    assert refusal({"t5_precision": "fp8_quanto"}, "sd35_medium") == (
        "t5_precision=fp8_quanto quantizes the T5 encoder on the GPU: encoders=cached leaves it "
        "off; use encoders=online or text"
    )
    assert refusal({"encoders": "text", "t5_precision": "fp8_quanto"}, "sdxl") is not None
    preset = load_preset("flux_dev")
    subject = Subject({**defaults(), "encoders": "text", "t5_precision": "fp8_quanto"}, preset)
    knob = REGISTRY["t5_precision"]
    said = knob.express("simpletuner", "fp8_quanto", subject)
    assert isinstance(said, Say) and said.settings == {"text_encoder_2_precision": "fp8-quanto"}
    for vocabulary in ("kohya", "diffusers"):
        assert isinstance(knob.express(vocabulary, "fp8_quanto", subject), Refuse)
    encoders = REGISTRY["encoders"]
    kohya = encoders.express("kohya", "text", subject)
    assert isinstance(kohya, Say) and kohya.settings["cache_latents"] is True
    assert kohya.settings["cache_text_encoder_outputs"] is False
    simpletuner = encoders.express("simpletuner", "text", subject)
    assert isinstance(simpletuner, Say)
    assert simpletuner.settings == {"vae_cache_ondemand": False, "text_cache_ondemand": True}
