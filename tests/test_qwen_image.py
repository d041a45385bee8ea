"""Qwen-Image: its 60 dual-stream blocks over 2x2-packed latents, prompted by Qwen2.5-VL, trained
on fake tensors as on real ones.

The shipped preset is checked against the published shapes (at 1024x1024, QwenImagePipeline's
default size, 128x128 latents and 4,096 tokens of 64 channels) and parameter counts (20.430 B the
DiT, 8.292 B Qwen2.5-VL-7B with its vision tower and LM head); a Qwen-Image of the preset's code
paths at a CPU's size holds the same allocations on the `simulate` backend as on the `cpu` one,
with LoRA and full training, checkpointing, and the text encoder and VAE online with a validation
image decoded.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
from helpers import assert_fake_equals_real, refusal, spec, with_blocks

from autofit.backends import simulate
from autofit.models import load_preset
from autofit.records.probe import ProbeSpec
from autofit.workloads import workload_for
from autofit.workloads.companions import build_companion
from autofit.workloads.diffusion import pack, unpack

# Qwen-Image's block (both streams' attention with query-key norms, feed-forwards and
# modulation) at a width a CPU steps in a second; its rotary axes sum to the head width.
TINY_QWEN = {
    "num_layers": 2, "num_attention_heads": 2, "attention_head_dim": 16,
    "axes_dims_rope": [4, 6, 6], "joint_attention_dim": 32,
}  # fmt: skip
# Qwen2.5-VL's language model (its multimodal rotary sections sum to half a head) and a vision
# tower of one block, which a text prompt leaves idle; the VAE likewise.
TINY_VL = {
    "text_config": {
        "vocab_size": 500, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
        "rope_scaling": {"rope_type": "default", "mrope_section": [2, 1, 1]},
    },
    "vision_config": {
        "depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
        "out_hidden_size": 32, "fullatt_block_indexes": [0],
    },
}  # fmt: skip
TINY_VAE = {"base_dim": 8}


def tiny_qwen_image(backend: str = "simulate", **knobs: Any) -> ProbeSpec:
    """qwen_image's probe (batch 2 of 64 px images unless `knobs` say otherwise) on a Qwen-Image
    of TINY_QWEN's widths, its prompt 16 tokens after a 4-token template."""
    probe = spec("qwen_image", backend=backend, **{"batch_size": 2, "resolution": 64, **knobs})
    model = copy.deepcopy(probe.model)
    model["architecture"].update(TINY_QWEN)
    model["inputs"].update(text_tokens=16, template_tokens=4, text_dim=32)
    encoder = model["companions"]["text_encoder"]["architecture"]
    for part, sizes in TINY_VL.items():
        encoder[part].update(sizes)
    model["companions"]["vae"]["architecture"].update(TINY_VAE)
    return dataclasses.replace(probe, model=model)


def test_a_1024_image_is_4096_tokens_of_64_channels() -> None:
    preset = load_preset("qwen_image")
    workload = workload_for(preset)
    assert preset.resolution == 1024 and preset.shape(1024) == (1024, 1024)
    latents = workload.latent_shape(1, 1024)
    assert latents == (1, 16, 128, 128)
    tokens = pack(torch.empty(latents, device="meta"))
    assert tokens.shape == (1, 4096, preset.architecture["in_channels"]) == (1, 4096, 64)
    assert unpack(tokens, torch.Size(latents)).shape == latents


def test_the_published_configs_build_their_parameter_counts() -> None:
    """The DiT (published as 20B), Qwen2.5-VL-7B whole (its language model, LM head and vision
    tower) and the VAE, built on the meta device from the shipped files."""
    preset = load_preset("qwen_image")
    with torch.device("meta"):
        dit = workload_for(preset).build_model(torch.bfloat16)
        encoder = build_companion(preset.companions["text_encoder"])
        vae = build_companion(preset.companions["vae"])

    def count(module: torch.nn.Module) -> int:
        return sum(p.numel() for p in module.parameters())

    assert count(dit) == 20_430_401_088
    assert count(encoder) == 8_292_166_656
    assert count(vae) == 126_892_531


@pytest.mark.parametrize(
    "knobs",
    [
        dict(train_mode="lora", checkpointing=False),
        dict(train_mode="lora", checkpointing=True),
        dict(train_mode="full", checkpointing=True, precision="bf16_pure"),
        dict(train_mode="lora", encoders="online", validation="on"),
    ],
    ids=["lora", "lora-ckpt", "full-ckpt", "online-validation"],
)
def test_simulated_allocations_equal_real_ones(knobs: dict[str, Any]) -> None:
    probe = tiny_qwen_image(**knobs)
    assert_fake_equals_real(probe)


def test_swapping_blocks_holds_less_up_to_musubis_limit() -> None:
    """On Qwen-Image's own widths (four of its blocks): each block swapped leaves the GPU, and
    the swap stops where musubi-tuner's does, one block short of all 60."""

    def peak(**knobs: Any) -> int:
        probe = with_blocks(spec("qwen_image", train_mode="lora", resolution=512, **knobs), 4)
        _, log = simulate.trace(probe)
        return log.peak_report().peak_allocated_bytes

    assert peak(swap_blocks=2) < peak(swap_blocks=0)
    assert refusal({"train_mode": "lora", "swap_blocks": 60}, "qwen_image") is not None
    assert refusal({"train_mode": "lora", "swap_blocks": 59}, "qwen_image") is None
