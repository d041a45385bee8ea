"""model=sdxl_controlnet: diffusers' ControlNet SDXL example, its ControlNet (from_unet, in fp32)
trained against the frozen UNet, on fake tensors and on real ones on the CPU."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from helpers import spec

from autofit.backends import cpu, simulate


def _tiny(backend: str = "simulate", **knobs: object):
    """The preset's structure at width 32 (UNet levels of 32, 64 and 64 channels, one
    transformer layer each, text encoders of width 32, a VAE of 32 channels), 128 px."""
    probe = spec("sdxl_controlnet", backend=backend, batch_size=1, resolution=128, **knobs)
    model = copy.deepcopy(probe.model)
    model["architecture"].update(
        block_out_channels=[32, 64, 64], transformer_layers_per_block=[1, 1, 1],
        attention_head_dim=[1, 2, 2], cross_attention_dim=64, addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=32 + 6 * 8,
    )  # fmt: skip
    model["inputs"].update(text_dim=64, pooled_dim=32)
    for name, width in (("text_encoder", 32), ("text_encoder_2", 32)):
        model["companions"][name]["architecture"].update(
            hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
            num_attention_heads=2,
        )  # fmt: skip
    model["companions"]["text_encoder_2"]["architecture"]["projection_dim"] = 32
    model["companions"]["vae"]["architecture"]["block_out_channels"] = [32, 32, 32, 32]
    return dataclasses.replace(probe, model=model)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_fake_and_real_hold_the_same_bytes(checkpointing: bool) -> None:
    # From cached latents (the text encoders resident): the VAE's encoder, run under autocast,
    # leaves its attention's output channels-last, which convolutions carry on as CUDA's do on
    # fake tensors and the CPU's do not (its convolutions return contiguous tensors).
    knobs = {"precision": "fp16", "checkpointing": checkpointing}
    _, fake = simulate.trace(_tiny(**knobs))
    _, real = cpu.trace(_tiny("cpu", **knobs))
    assert fake.peak == real.peak
    assert fake.peak_report().breakdown == real.peak_report().breakdown


def test_the_controlnet_trains_in_fp32_against_a_frozen_16_bit_unet() -> None:
    run, log = simulate.trace(_tiny(precision="fp16"))
    trained = {p.dtype for p in run.model.controlnet.parameters() if p.requires_grad}
    frozen = {p.dtype for p in run.model.transformer.parameters()}
    assert str(trained) == "{torch.float32}" and str(frozen) == "{torch.float16}"
    assert not any(p.requires_grad for p in run.model.transformer.parameters())
    # gradients stay allocated (zeroed in place) and the text encoders stay resident when cached
    assert log.live_bytes("gradients") > 0
    assert set(run.companions) == {"text_encoder", "text_encoder_2"}


def test_the_full_controlnet_has_sdxls_published_size() -> None:
    """ControlNetModel.from_unet on SDXL base: 1.25 B parameters (diffusers' controlnet SDXL
    checkpoints hold 2.5 GB in fp16)."""
    run, _ = simulate.trace(spec("sdxl_controlnet", batch_size=1, resolution=512))
    assert 1.24e9 < run.trainable_param_count < 1.26e9
