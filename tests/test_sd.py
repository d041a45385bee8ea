"""model=sd15 and model=sd21: Stable Diffusion 1.5 and 2.1, the UNet family that shares its
workload with SDXL (autofit/workloads/unet.py): published shapes and sizes, the same bytes on
fake and real tensors on a CPU-sized UNet of the same code paths, and 2.1's velocity target."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from helpers import spec

from autofit.backends import cpu, simulate
from autofit.errors import ConfigError
from autofit.export import TARGETS
from autofit.models import load_preset
from autofit.workloads.sd import SDWorkload
from autofit.workloads.unet import STEPS, _alphas_cumprod


def _tiny(model: str, backend: str = "simulate", **knobs: object):
    """The preset's structure (its block types, attention layout, text encoder kind and VAE) at
    a width a CPU steps in seconds: UNet levels of 16, 32, 32 and 32 channels with one block
    each, a 2-layer text encoder of width 32, a VAE of 32 channels, 64 px."""
    probe = spec(model, backend=backend, **{"batch_size": 1, "resolution": 64, **knobs})
    model_ = copy.deepcopy(probe.model)
    heads = model_["architecture"]["attention_head_dim"]
    model_["architecture"].update(
        block_out_channels=[16, 32, 32, 32], layers_per_block=1, norm_num_groups=8,
        cross_attention_dim=32, attention_head_dim=[1, 2, 2, 2] if isinstance(heads, list) else 2,
    )  # fmt: skip
    model_["inputs"].update(text_dim=32, clip_tokens=16)
    model_["companions"]["text_encoder"]["architecture"].update(
        vocab_size=500, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=16, projection_dim=32,
    )  # fmt: skip
    model_["companions"]["vae"]["architecture"]["block_out_channels"] = [32, 32, 32, 32]
    return dataclasses.replace(probe, model=model_)


@pytest.mark.long
@pytest.mark.parametrize(
    ("model", "knobs"),
    [
        ("sd15", {"train_mode": "lora", "precision": "bf16"}),
        ("sd21", {"train_mode": "full", "checkpointing": True}),
        ("sd15", {"train_mode": "lora", "encoders": "online", "validation": "on"}),
        ("sd21", {"train_mode": "lora", "encoders": "text", "checkpointing": True}),
    ],
    ids=["sd15-lora", "sd21-full-checkpointing", "sd15-online-validation", "sd21-text-encoder"],
)
def test_fake_and_real_hold_the_same_bytes(model: str, knobs: dict) -> None:
    _, fake = simulate.trace(_tiny(model, **knobs))
    _, real = cpu.trace(_tiny(model, "cpu", **knobs))
    # The same peak of the same categories. (The full logs differ where attention runs: the
    # simulator lays out PyTorch's fused attention as a GPU runs it, the CPU runs its own; the
    # SDXL ControlNet's test compares the same way.)
    assert fake.peak == real.peak
    assert fake.peak_report().breakdown == real.peak_report().breakdown


@pytest.mark.parametrize(("model", "resolution", "side"), [("sd15", 512, 64), ("sd21", 768, 96)])
def test_latents_have_the_published_shape(model: str, resolution: int, side: int) -> None:
    preset = load_preset(model)
    workload = SDWorkload(preset)
    assert workload.latent_shape(2, resolution) == (2, 4, side, side)
    assert preset.architecture["sample_size"] == side  # the UNet's native latent size
    with torch.device("meta"):
        text = workload.conditions(2, resolution, torch.device("meta"), torch.float16)["text"]
    assert text.shape == (2, 77, preset.architecture["cross_attention_dim"])


@pytest.mark.long
@pytest.mark.parametrize(("model", "billions"), [("sd15", 0.8595), ("sd21", 0.8659)])
def test_the_unet_has_the_published_size(model: str, billions: float) -> None:
    """An 860M UNet (the SD 1 model card; 2.x has "the same number of parameters in the U-Net as
    1.5"): 3.44 and 3.46 GB of fp32 weights on the hub."""
    run, _ = simulate.trace(spec(model, batch_size=1, resolution=256, train_mode="full"))
    assert run.trainable_param_count / 1e9 == pytest.approx(billions, abs=5e-4)


def test_sd21_trains_the_velocity_and_sd15_the_noise() -> None:
    """The target the training scripts take (DDPMScheduler.get_velocity for v_prediction): the
    same noise and timesteps drawn again from the same seed give it."""
    latents = torch.randn(3, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    table = _alphas_cumprod(torch.device("cpu"))
    for model in ("sd15", "sd21"):
        workload = SDWorkload(load_preset(model))
        torch.manual_seed(1)
        noisy, target, t = workload.noising(latents)
        torch.manual_seed(1)
        noise = torch.randn_like(latents)
        steps = torch.randint(0, STEPS, (3,))
        alpha = table[steps].view(-1, 1, 1, 1)
        assert torch.allclose(noisy, alpha.sqrt() * latents + (1 - alpha).sqrt() * noise)
        velocity = alpha.sqrt() * noise - (1 - alpha).sqrt() * latents
        expected = velocity if model == "sd21" else noise
        assert torch.allclose(target, expected), model
        assert torch.equal(t, steps.float() / STEPS)


# --- what each trainer is told (sd-scripts 48d368fa, diffusers 58eb52c0, SimpleTuner 4.10.1) ----


def _point(model: str, tmp_path, **knobs: object):  # type: ignore[no-untyped-def]
    from autofit.export.point import StudyPoint
    from autofit.knobs import defaults

    preset = load_preset(model)
    config = {**defaults(), "resolution": preset.resolution, "precision": "fp16", **knobs}
    return StudyPoint(
        study=model, summary_path=tmp_path / "summary.json", preset=preset, gpu="rtx3090",
        backend="simulate", label="best", config=config, peak_bytes=1, budget_bytes=2,
        samples_per_s=1.0,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("model", "train_mode", "script", "flags"),
    [
        ("sd15", "lora", "train_network.py", {}),
        ("sd21", "lora", "train_network.py", {"v2": True, "v_parameterization": True}),
        ("sd21", "full", "train_db.py", {"v2": True, "v_parameterization": True, "stop_text_encoder_training": -1}),
    ],
)  # fmt: skip
def test_kohya_trains_sd_with_its_sd_scripts_and_sd2_flags(
    tmp_path, model: str, train_mode: str, script: str, flags: dict
) -> None:  # type: ignore[no-untyped-def]
    import json
    from pathlib import Path

    import tomllib

    options = json.loads(
        (Path(__file__).parent / "fixtures/export/sd_scripts_options.json").read_text()
    )
    plan = TARGETS["kohya"].run(
        _point(model, tmp_path, train_mode=train_mode, encoders="text"), tmp_path / "out"
    )
    train = tomllib.loads(plan.files["train.toml"])
    assert f" {script} " in plan.command
    assert set(train) <= set(options["options"][script.removesuffix(".py")])
    assert {
        k: train[k]
        for k in ("v2", "v_parameterization", "stop_text_encoder_training")
        if k in train
    } == flags
    assert train["cache_latents"] is True and "cache_text_encoder_outputs" not in train


def test_kohya_refuses_a_text_encoder_cache_sd_scripts_lacks_for_sd(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="have no text-encoder output cache"):
        TARGETS["kohya"].run(_point("sd15", tmp_path, train_mode="lora"), tmp_path / "out")


@pytest.mark.parametrize(
    ("train_mode", "script"),
    [("full", "train_text_to_image.py"), ("lora", "train_text_to_image_lora.py")],
)
def test_diffusers_trains_sd_with_its_text_to_image_examples(
    tmp_path, train_mode: str, script: str
) -> None:  # type: ignore[no-untyped-def]
    plan = TARGETS["diffusers"].run(
        _point(
            "sd21", tmp_path, train_mode=train_mode, encoders="online", optimizer_impl="foreach"
        ),
        tmp_path / "out",
    )
    assert f"examples/text_to_image/{script} " in plan.command
    assert "--pretrained_model_name_or_path=stabilityai/stable-diffusion-2-1" in plan.command


def test_simpletuner_trains_sd15_as_sd1x_and_refuses_sd21(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    point = _point("sd15", tmp_path, train_mode="lora", precision="bf16_autocast")
    plan = TARGETS["simpletuner"].run(point, tmp_path / "out")
    config = json.loads(plan.files["config.json"])
    assert (config["model_family"], config["model_flavour"]) == ("sd1x", "1.5")
    with pytest.raises(ConfigError, match="target=simpletuner cannot train sd21 .*no sd2x"):
        TARGETS["simpletuner"].run(_point("sd21", tmp_path, train_mode="lora"), tmp_path / "out2")
