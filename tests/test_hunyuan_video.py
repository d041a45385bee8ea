"""HunyuanVideo, the second video family: clips of `frames` frames through its causal 3-D VAE, its
dual- and single-stream blocks trained on fake tensors as on real ones.

The shipped preset is checked against the published shapes (129 frames are 33 latent frames; at
720x1280, 90x160 latents, 115,200 tokens after the 1x2x2 patches); a HunyuanVideo of the preset's
code paths at a CPU's size holds the same allocations on the `simulate` backend as on the `cpu`
one, with LoRA and full training, checkpointing, and online encoders (the LLM, CLIP-L and the
VAE encoding the clip) with a validation clip decoded.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from helpers import assert_fake_equals_real, spec, with_blocks

from autofit.backends import simulate
from autofit.knobs.frames import latent_frames
from autofit.models import load_preset
from autofit.records.probe import ProbeSpec
from autofit.workloads import workload_for

# HunyuanVideo's blocks (both streams' attention with query-key norms, the token refiner, the
# guidance and pooled-text modulation) at a width a CPU steps in a second; its rotary axes must
# sum to the head width. The LLM, CLIP-L and the VAE likewise.
TINY_HV = {
    "num_attention_heads": 2, "attention_head_dim": 16, "rope_axes_dim": [4, 6, 6],
    "num_layers": 2, "num_single_layers": 2, "num_refiner_layers": 1,
    "text_embed_dim": 32, "pooled_projection_dim": 16,
}  # fmt: skip
TINY_LLM = {
    "vocab_size": 500, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
}  # fmt: skip
TINY_CLIP = {
    "vocab_size": 500, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 2, "max_position_embeddings": 8, "projection_dim": 16,
}  # fmt: skip
TINY_VAE = {"block_out_channels": [8, 8, 8, 8], "layers_per_block": 1, "norm_num_groups": 4}


def tiny_hunyuan_video(backend: str = "simulate", **knobs: Any) -> ProbeSpec:
    """hunyuan_video's probe (batch 2 of 5-frame 64 px clips unless `knobs` say otherwise) on a
    HunyuanVideo of TINY_HV's widths, its prompt 16 tokens after a 4-token template, CLIP's 8."""
    probe = spec(
        "hunyuan_video",
        backend=backend,
        **{"batch_size": 2, "resolution": 64, "frames": 5, **knobs},
    )
    model = copy.deepcopy(probe.model)
    model["architecture"].update(TINY_HV)
    model["inputs"].update(
        text_tokens=16, template_tokens=4, clip_tokens=8,
        text_dim=TINY_HV["text_embed_dim"], pooled_dim=TINY_HV["pooled_projection_dim"],
    )  # fmt: skip
    companions = model["companions"]
    companions["text_encoder"]["architecture"].update(TINY_LLM)
    companions["text_encoder_2"]["architecture"].update(TINY_CLIP)
    companions["vae"]["architecture"].update(TINY_VAE)
    return dataclasses.replace(probe, model=model)


def test_a_native_clip_is_33_latent_frames() -> None:
    preset = load_preset("hunyuan_video")
    workload = workload_for(preset)
    assert workload.frames == 129
    assert latent_frames(129, preset) == 33
    # At 720x1280, its published size: 33 x 45 x 80 patches.
    assert 33 * (720 // 8 // 2) * (1280 // 8 // 2) == 118_800
    assert workload.latent_shape(1, 1280) == (1, 16, 33, 90, 160)
    assert workload_for(preset, 33).latent_shape(2, 512) == (2, 16, 9, 36, 64)


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
    probe = tiny_hunyuan_video(**knobs)
    assert_fake_equals_real(probe)


def test_a_longer_clip_holds_more() -> None:
    """On HunyuanVideo's own widths (two blocks of each list): activations grow with the latent
    frames, and checkpointing keeps less of them."""

    def peak(**knobs: Any) -> int:
        probe = with_blocks(spec("hunyuan_video", train_mode="lora", resolution=256, **knobs), 2)
        _, log = simulate.trace(probe)
        return log.peak_report().peak_allocated_bytes

    short, long = peak(frames=9), peak(frames=33)
    assert long > short
    assert peak(frames=33, checkpointing=True) < long
