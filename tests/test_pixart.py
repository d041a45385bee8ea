"""PixArt-Sigma: its DiT of cross-attention blocks with adaLN-single, trained to predict the noise
on the SDXL VAE's latents, its captions from T5-XXL, on fake tensors as on real ones.

The shipped presets are checked against the published shapes (1024 px: 128x128 latents, 4,096
tokens after the 2x2 patches; its transformer 0.611 B parameters) and the published configs'
differences (the 512 px model's sample size and position-embedding scale); a PixArt of the
presets' code paths at a CPU's size holds the same allocations on the `simulate` backend as on
the `cpu` one, with LoRA, full training with checkpointing and every-other-block checkpointing,
and online encoders (T5 and the VAE) with a validation image decoded.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
from helpers import assert_fake_equals_real, spec, with_blocks

from autofit.backends import simulate
from autofit.knobs import REGISTRY, Refuse, Subject
from autofit.knobs import defaults as knob_defaults
from autofit.models import load_preset
from autofit.records.probe import ProbeSpec
from autofit.workloads import workload_for

# PixArt's block (self-attention, caption cross-attention, the GELU feed-forward, adaLN-single's
# shared modulation and the caption projection) at a width a CPU steps in a second; T5 and the
# SDXL VAE likewise.
TINY_PIXART = {
    "num_attention_heads": 2, "attention_head_dim": 16, "num_layers": 2,
    "cross_attention_dim": 32, "caption_channels": 32, "sample_size": 8,
}  # fmt: skip
TINY_T5 = {"vocab_size": 500, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4}
# The VAE without its mid-block attention: that attention hands on its output transposed back
# from tokens (not contiguous), which the CPU's group norm copies to a contiguous tensor before
# reading and CUDA's (the fake step's) reads as it is: a decode through it on the CPU holds one
# copy more than on the GPU.
TINY_VAE = {
    "block_out_channels": [8, 8, 8, 8], "layers_per_block": 1, "norm_num_groups": 4,
    "mid_block_add_attention": False,
}  # fmt: skip


def tiny_pixart(backend: str = "simulate", **knobs: Any) -> ProbeSpec:
    """pixart_sigma_1024's probe (batch 2 at 64 px unless `knobs` say otherwise) on a PixArt of
    TINY_PIXART's widths, its captions 16 tokens of TINY_T5, its VAE TINY_VAE."""
    probe = spec(
        "pixart_sigma_1024", backend=backend, **{"batch_size": 2, "resolution": 64, **knobs}
    )
    model = copy.deepcopy(probe.model)
    model["architecture"].update(TINY_PIXART)
    model["inputs"].update(text_tokens=16, text_dim=TINY_PIXART["caption_channels"])
    model["companions"]["text_encoder"]["architecture"].update(TINY_T5)
    model["companions"]["vae"]["architecture"].update(TINY_VAE)
    return dataclasses.replace(probe, model=model)


def test_1024_px_is_128x128_latents_and_4096_tokens() -> None:
    preset = load_preset("pixart_sigma_1024")
    workload = workload_for(preset)
    assert workload.latent_shape(1, 1024) == (1, 4, 128, 128)
    patch = preset.architecture["patch_size"]
    assert (1024 // 8 // patch) ** 2 == 4096
    assert preset.architecture["sample_size"] == 1024 // 8  # the config's own latent size
    # 512 px: 64x64 latents, 1,024 tokens
    assert workload_for(load_preset("pixart_sigma_512")).latent_shape(1, 512) == (1, 4, 64, 64)


def test_the_presets_have_the_published_size_and_differ_as_the_published_configs() -> None:
    big, small = load_preset("pixart_sigma_1024"), load_preset("pixart_sigma_512")
    with torch.device("meta"):
        model = workload_for(big).build_model(torch.float32)
    # 610,856,096 fp32 parameters: 2,443,424,384 of its published file's 2,443,492,488 bytes
    assert sum(p.numel() for p in model.parameters()) == 610_856_096
    assert not model.use_additional_conditions and model.out_channels == 8
    differs = {k for k in big.architecture.keys() | small.architecture.keys()
               if big.architecture.get(k) != small.architecture.get(k)}  # fmt: skip
    assert differs == {"sample_size", "interpolation_scale", "use_additional_conditions"}
    with torch.device("meta"):  # left out of the 512 px config: diffusers reads it as false
        assert not workload_for(small).build_model(torch.float32).use_additional_conditions


def test_the_loss_trains_the_noise_half_of_the_output() -> None:
    """The model predicts 8 channels (the noise and a learned variance); the loss compares the
    first 4 with the noise, as SimpleTuner's PixArt does."""
    probe = tiny_pixart("cpu")
    workload = workload_for(load_preset("pixart_sigma_1024"))
    workload.preset = dataclasses.replace(workload.preset, **{
        k: probe.model[k] for k in ("architecture", "inputs", "companions")
    })  # fmt: skip
    model = workload.build_model(torch.float32)
    batch = workload.make_batch(2, 64, torch.device("cpu"), torch.float32)
    noisy, target, t = workload.noising(batch["latents"])
    conditions = {k: v for k, v in batch.items() if k != "latents"}
    assert workload.predict(model, noisy, t, conditions).shape == target.shape == (2, 4, 8, 8)
    assert workload.loss(model, batch).dim() == 0


@pytest.mark.parametrize(
    "knobs",
    [
        dict(train_mode="lora", checkpointing=False),
        dict(train_mode="full", checkpointing=True),
        dict(train_mode="full", checkpointing=True, checkpoint_interval=2, precision="bf16_pure"),
        dict(train_mode="lora", encoders="online", validation="on"),
    ],
    ids=["lora", "full-ckpt", "full-ckpt-every-2", "online-validation"],
)
def test_simulated_allocations_equal_real_ones(knobs: dict[str, Any]) -> None:
    probe = tiny_pixart(**knobs)
    assert_fake_equals_real(probe)


def test_a_larger_image_holds_more_and_checkpointing_less() -> None:
    """On PixArt's own widths (two of its blocks): activations grow with the image's tokens."""

    def peak(**knobs: Any) -> int:
        probe = with_blocks(spec("pixart_sigma_1024", train_mode="lora", **knobs), 2)
        _, log = simulate.trace(probe)
        return log.peak_report().peak_allocated_bytes

    small, large = peak(resolution=512), peak(resolution=1024)
    assert large > small
    assert peak(resolution=1024, checkpointing=True) < large


def test_simpletuner_refuses_fp8_quanto_for_pixart_and_takes_int8_quanto() -> None:
    """Its PixArt model's check_user_config raises for fp8-quanto (bghira/SimpleTuner bc8e6ab)."""
    knob = REGISTRY["base_precision"]
    subject = Subject({**knob_defaults(), "train_mode": "lora"}, load_preset("pixart_sigma_1024"))
    taken = knob.express(
        "simpletuner", "int8_quanto", subject.with_value("base_precision", "int8_quanto")
    )
    assert taken.settings == {"base_model_precision": "int8-quanto"}
    refused = knob.express(
        "simpletuner", "fp8_quanto", subject.with_value("base_precision", "fp8_quanto")
    )
    assert isinstance(refused, Refuse)
    assert refused.why == "SimpleTuner's pixart model refuses base_model_precision=fp8-quanto"
    offered = knob.offers("simpletuner", subject)
    assert "int8_quanto" in offered and "fp8_quanto" not in offered
