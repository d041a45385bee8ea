"""Wan, the first video family: clips of `frames` frames through the Wan VAE's causal 3-D
compression, trained on fake tensors as on real ones.

The shipped presets are checked against the published shapes (81 frames at 480x832 are 21 latent
frames of 60x104, 32,760 tokens after the 1x2x2 patches: the musubi-tuner and Wan configs'
arithmetic); a Wan model of the presets' code paths at a CPU's size holds the same allocations on
the `simulate` backend as on the `cpu` one, with cached and with online encoders (umT5 and the
Wan VAE encoding the clip) and with a validation clip decoded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import (
    assert_fake_equals_real,
    assert_refused,
    in_process,
    spec,
    tiny_wan,
    with_blocks,
)

from autofit.backends import simulate
from autofit.knobs.frames import latent_frames
from autofit.models import load_preset
from autofit.records.probe import Outcome, ProbeResult
from autofit.search.pareto import fastest_and_best, pareto_front, run_size
from autofit.workloads import workload_for


def test_a_native_clip_is_21_latent_frames_of_32760_tokens() -> None:
    preset = load_preset("wan2_1_t2v_1_3b")
    workload = workload_for(preset)
    assert workload.frames == 81
    assert workload.latent_shape(1, 832) == (1, 16, 21, 60, 104)
    assert latent_frames(81, preset) * (60 // 2) * (104 // 2) == 32_760
    assert workload_for(preset, 17).latent_shape(2, 832) == (2, 16, 5, 60, 104)
    # The 14B's native 720x1280: 75,600 tokens.
    big = workload_for(load_preset("wan2_1_t2v_14b"))
    _, _, f, h, w = big.latent_shape(1, 1280)
    assert f * (h // 2) * (w // 2) == 75_600


@pytest.mark.parametrize(
    "knobs",
    [
        dict(train_mode="lora", checkpointing=False),
        dict(train_mode="lora", checkpointing=True, frames=1),
        dict(train_mode="full", checkpointing=True, precision="bf16_pure"),
        dict(train_mode="lora", encoders="online", validation="on"),
        dict(image=True, train_mode="lora", checkpointing=True),
        # Wan 2.1 I2V: Wan 2.2 I2V's first-frame channels (encoded online: a second clip through
        # the VAE) and the frame's CLIP embedding (online: the CLIP vision tower)
        dict(model="wan2_1_i2v_14b", train_mode="lora", checkpointing=True),
        dict(model="wan2_1_i2v_14b", train_mode="lora", encoders="online", validation="on"),
        dict(
            model="wan2_2_ti2v_5b", train_mode="lora", checkpointing=True, encoders="online",
            validation="on",
        ),
    ],
    ids=[
        "lora", "lora-ckpt-one-frame", "full-ckpt", "online-validation", "i2v", "i2v-clip",
        "i2v-clip-online", "ti2v-online-validation",
    ],
)  # fmt: skip
def test_simulated_allocations_equal_real_ones(knobs: dict[str, Any]) -> None:
    probe = tiny_wan(**knobs)
    assert_fake_equals_real(probe)


def test_an_image_to_video_expert_takes_the_first_frame_beside_the_clip() -> None:
    """Wan 2.2 I2V: the first frame's 4-channel mask and 16-channel latents on the clip's 16."""
    workload = workload_for(load_preset("wan2_2_i2v_a14b"))
    batch = workload.make_batch(1, 1280, torch.device("meta"), torch.bfloat16)
    assert batch["latents"].shape == (1, 16, 21, 90, 160)
    assert batch["image"].shape == (1, 20, 21, 90, 160)
    assert load_preset("wan2_2_i2v_a14b").architecture["in_channels"] == 16 + 20


def test_wan_2_1_i2v_attends_a_clip_embedding_of_the_first_frame_in_every_block() -> None:
    """Wan 2.1 I2V: Wan 2.2 I2V's 36 input channels, and 257 CLIP tokens x 1280 that each
    block's cross-attention projects with its own keys and values (LoRA adapts them too)."""
    preset = load_preset("wan2_1_i2v_14b")
    batch = workload_for(preset).make_batch(1, 1280, torch.device("meta"), torch.bfloat16)
    assert batch["image"].shape == (1, 20, 21, 90, 160)
    assert batch["image_embeds"].shape == (1, 257, 1280)
    assert preset.architecture["image_dim"] == 1280 == preset.inputs["image_dim"]
    assert {"add_k_proj", "add_v_proj"} <= set(preset.lora_targets)
    assert preset.companions["image_encoder"]["kind"] == "clip_vision"
    probe = tiny_wan(model="wan2_1_i2v_14b", train_mode="lora")
    built = simulate.built(probe)
    names = [n for n, _ in built.model.named_parameters() if n.endswith("lora_A.default.weight")]
    assert any(".attn2.add_k_proj." in n for n in names)
    assert any(".attn2.add_v_proj." in n for n in names)


def test_wan_2_2_ti2v_is_its_vae_s_48_channels_at_16x_with_a_timestep_per_token() -> None:
    """Wan 2.2 TI2V 5B at its native 121 frames of 704x1280: 31 latent frames of 44x80 in 48
    channels, no condition channels; the first latent frame's tokens at timestep 0."""
    preset = load_preset("wan2_2_ti2v_5b")
    workload = workload_for(preset)
    batch = workload.make_batch(1, 1280, torch.device("meta"), torch.bfloat16)
    assert set(batch) == {"latents", "text"} and batch["latents"].shape == (1, 48, 31, 44, 80)
    assert preset.architecture["in_channels"] == preset.inputs["latent_channels"] == 48
    latents = torch.randn(2, 48, 3, 4, 6)
    noisy, _, t = workload.noising(latents)
    assert torch.equal(noisy[:, :, :1], latents[:, :, :1])  # the given frame stays clean
    steps = workload.timesteps(noisy, t)
    assert steps.shape == (2, 3 * 2 * 3)  # a timestep per 1x2x2 patch
    assert (steps[:, :6] == 0).all()
    assert torch.equal(steps[:, 6:], (t * 1000)[:, None].expand(2, 12))


def test_a_longer_clip_holds_more_and_checkpointing_holds_less() -> None:
    """On the 1.3B's own widths (two of its blocks): activations grow with the latent frames."""

    def peak(**knobs: Any) -> int:
        probe = with_blocks(spec("wan2_1_t2v_1_3b", train_mode="lora", resolution=480, **knobs), 2)
        _, log = simulate.trace(probe)
        return log.peak_report().peak_allocated_bytes

    short, long = peak(frames=17), peak(frames=49)
    assert long > short
    assert peak(frames=49, checkpointing=True) < long


def test_a_clip_length_the_vae_cannot_take_is_refused_naming_the_nearest() -> None:
    assert_refused(
        {"frames": 80},
        "wan2_1_t2v_1_3b",
        "frames=80 is not valid for wan2_1_t2v_1_3b: its VAE encodes the first frame and then 4 "
        "at a time, so a clip is 1 + 4k frames (try 77 or 81)",
    )


def test_frames_are_for_video_models_only() -> None:
    assert_refused(
        {"frames": 17},
        "sdxl",
        "frames=17 is for video models (wan, hunyuan_video); sdxl trains on images",
    )


@pytest.mark.parametrize(
    "model,frames,line",
    [
        (
            "wan2_1_t2v_1_3b",
            "80",
            "target.frames=80 is not valid for wan2_1_t2v_1_3b: its VAE "
            "encodes the first frame and then 4 at a time, so a clip is 1 + 4k frames (try 77 or 81)",
        ),
        (
            "sdxl",
            "33",
            "target.frames=33 is for video models (wan, hunyuan_video); sdxl trains on images",
        ),
    ],
)
def test_a_search_for_a_clip_length_it_cannot_train_says_so_in_one_line(
    model: str, frames: str, line: str, tmp_path: Path
) -> None:
    done = in_process(
        "search", f"model={model}", "gpu=rtx4090", f"target.frames={frames}", cwd=tmp_path
    )
    assert done.returncode == 2
    assert done.stderr == f"autofit: error: {line}\n"
    assert not (tmp_path / "results").exists()  # refused before anything is written


def _clip_run(frames: int, batch: int, samples_per_s: float, peak: int) -> ProbeResult:
    return ProbeResult(
        outcome=Outcome.OK, backend="simulate", gpu="rtx4090", model="wan2_1_t2v_1_3b",
        config={"batch_size": batch, "resolution": 832, "frames": frames}, budget_bytes=100,
        peak_bytes=peak, samples_per_s=samples_per_s,
    )  # fmt: skip


def test_the_answer_is_at_the_longest_clip_that_fits_and_the_pareto_front_counts_frames() -> None:
    long, short, shorter_faster = (
        _clip_run(81, 1, 0.06, 90), _clip_run(33, 2, 0.2, 80), _clip_run(33, 1, 0.21, 50),
    )  # fmt: skip
    fastest, best = fastest_and_best([short, long, shorter_faster], 832, 1)
    assert fastest is long and best is long  # slower per sample, but the longer clip
    fastest, _ = fastest_and_best([short, shorter_faster], 832, 1)
    assert fastest is shorter_faster  # where 81 frames fit nothing, the 33-frame runs answer
    # A clip of 81 frames at batch 1 is a larger run than 33 frames at batch 2.
    assert run_size(long) > run_size(short)
    assert pareto_front([long, short, shorter_faster])[832] == [shorter_faster, short, long]
