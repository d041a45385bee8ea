"""Chroma and FLUX.1 [schnell], the Flux-derived presets: Chroma's distilled guidance layer in place
of per-block modulation, T5-XXL alone with its attention mask; schnell without a guidance
embedding.

The shipped presets are checked against the published shapes (Chroma: 19 double and 38 single
blocks, 344 modulation vectors from the distilled guidance layer, 8.9 B parameters; schnell:
FLUX.1 [dev]'s shapes without the guidance embedder); a Chroma of the preset's code paths at a
CPU's size holds the same allocations on the `simulate` backend as on the `cpu` one, with LoRA,
full training with checkpointing, and online T5 and VAE with a validation image.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
from helpers import assert_fake_equals_real, spec

from autofit.backends import simulate
from autofit.families import REGISTRY, kohya_max_blocks_to_swap
from autofit.models import load_preset
from autofit.records.probe import ProbeSpec
from autofit.workloads import workload_for
from autofit.workloads.chroma import prompt_mask

# Chroma's blocks, its distilled guidance layer and its pruned norms at a width a CPU steps in a
# second (the rotary axes sum to the head width); T5 and the VAE likewise. The VAE leaves out its
# mid-block attention: its residual comes out channels-last, and the group norm after it copies
# that input on the real CPU and not on fake tensors (three activation-sized temporaries of the
# decode, a gap of every AutoencoderKL family's validation, not of Chroma's).
TINY_CHROMA = {
    "num_attention_heads": 2, "attention_head_dim": 16, "axes_dims_rope": [4, 6, 6],
    "num_layers": 2, "num_single_layers": 2, "joint_attention_dim": 32,
    "approximator_num_channels": 16, "approximator_hidden_dim": 32, "approximator_layers": 2,
}  # fmt: skip
TINY_T5 = {
    "vocab_size": 500, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
}  # fmt: skip
TINY_VAE = {
    "block_out_channels": [32, 32], "down_block_types": ["DownEncoderBlock2D"] * 2,
    "up_block_types": ["UpDecoderBlock2D"] * 2, "layers_per_block": 1, "norm_num_groups": 8,
    "mid_block_add_attention": False,
}  # fmt: skip


def tiny_chroma(backend: str = "simulate", **knobs: Any) -> ProbeSpec:
    """chroma's probe (batch 2 at 64 px unless `knobs` say otherwise) on a Chroma of
    TINY_CHROMA's widths, its prompt 16 T5 tokens; the VAE compresses 2x, so 64 px are 32x32
    latents, 256 tokens after the 2x2 packing."""
    probe = spec("chroma", backend=backend, **{"batch_size": 2, "resolution": 64, **knobs})
    model = copy.deepcopy(probe.model)
    model["architecture"].update(TINY_CHROMA)
    model["inputs"].update(
        t5_tokens=16, text_dim=TINY_CHROMA["joint_attention_dim"], latent_downsample=2
    )
    companions = model["companions"]
    companions["text_encoder"]["architecture"].update(TINY_T5)
    companions["vae"]["architecture"].update(TINY_VAE)
    return dataclasses.replace(probe, model=model)


def _meta(name: str) -> torch.nn.Module:
    preset = load_preset(name)
    with torch.device("meta"):
        return workload_for(preset).build_model(torch.bfloat16)


def test_chroma_is_built_with_the_published_shapes() -> None:
    model = _meta("chroma")
    assert type(model).__name__ == REGISTRY["chroma"].denoiser_class == "ChromaTransformer2DModel"
    assert len(model.transformer_blocks) == 19 and len(model.single_transformer_blocks) == 38
    # One modulation vector per use: 3 per single block, 6 per stream of each double block, 2
    # for the output norm; each made by the distilled guidance layer from a 64-channel input.
    assert model.time_text_embed.mod_proj.shape == (3 * 38 + 2 * 6 * 19 + 2, 32)
    layer = model.distilled_guidance_layer
    assert layer.in_proj.in_features == 64 and len(layer.layers) == 5
    assert layer.in_proj.out_features == 5120 and layer.out_proj.out_features == 3072
    # No modulation in the blocks, no guidance or pooled-text embedder, no CLIP-sized input.
    names = {name for name, _ in model.named_modules()}
    assert "transformer_blocks.0.norm1.linear" not in names
    assert "single_transformer_blocks.0.norm.linear" not in names
    assert not any(
        n.endswith(("guidance_embedder", "time_text_embed.text_embedder")) for n in names
    )
    params = sum(p.numel() for p in model.parameters())
    assert params == 8_899_983_424  # SimpleTuner's quickstart: "an 8.9B-parameter" model
    assert sum(p.numel() for p in layer.parameters()) == 278_285_312


def test_chroma_is_conditioned_on_t5_alone_with_its_mask() -> None:
    preset = load_preset("chroma")
    assert set(preset.companions) == {"text_encoder", "vae"}
    assert preset.companions["text_encoder"]["kind"] == "t5_encoder"
    workload = workload_for(preset)
    batch = workload.make_batch(2, 1024, torch.device("meta"), torch.bfloat16)
    assert batch["text"].shape == (2, 512, 4096) and "pooled" not in batch
    assert batch["mask"].shape == (2, 512) and batch["mask"].dtype == torch.bool
    tokens = workload.tokens(2, torch.device("cpu"))
    assert set(tokens) == {"text_encoder", "text_encoder_mask"}
    # The pipeline's mask: the prompt's tokens and the first padding token.
    given = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]])
    assert prompt_mask(given).tolist() == [[True] * 4 + [False] * 2, [True] * 6]


def test_schnell_is_dev_without_the_guidance_embedding() -> None:
    schnell, dev = _meta("flux_schnell"), _meta("flux_dev")
    assert not hasattr(schnell.time_text_embed, "guidance_embedder")
    assert hasattr(dev.time_text_embed, "guidance_embedder")
    count = {
        m: sum(p.numel() for p in model.parameters()) for m, model in (("s", schnell), ("d", dev))
    }
    guidance = sum(p.numel() for p in dev.time_text_embed.guidance_embedder.parameters())
    assert count["s"] == count["d"] - guidance == 11_891_178_560
    assert load_preset("flux_schnell").inputs["t5_tokens"] == 256  # sd-scripts' and SimpleTuner's


@pytest.mark.parametrize("model", ["flux_schnell", "chroma"])
def test_the_flux_derived_presets_step_at_their_native_size(model: str) -> None:
    """One simulated step of the real preset with two blocks of each list (its shapes, the
    model's own forward), a LoRA on a 16-bit base."""
    from helpers import with_blocks

    probe = with_blocks(spec(model, train_mode="lora", resolution=512), 2)
    _, log = simulate.trace(probe)
    assert log.peak_report().peak_allocated_bytes > 0


def test_sd_scripts_swaps_chromas_blocks_as_fluxs() -> None:
    chroma = load_preset("chroma")
    assert kohya_max_blocks_to_swap("chroma", chroma.architecture) == chroma.max_swap_blocks == 35


@pytest.mark.parametrize(
    "knobs",
    [
        dict(train_mode="lora", checkpointing=False),
        dict(train_mode="full", checkpointing=True, precision="bf16_pure"),
        dict(train_mode="lora", encoders="online", validation="on"),
    ],
    ids=["lora", "full-ckpt", "online-validation"],
)
def test_simulated_allocations_equal_real_ones(knobs: dict[str, Any]) -> None:
    probe = tiny_chroma(**knobs)
    assert_fake_equals_real(probe)
