"""FLUX.1 Kontext [dev] and Qwen-Image-Edit, the image-editing models: each trained on a pair, the
target's latents and a reference image's, whose tokens follow the target's in the transformer's
image sequence; the loss is on the target's tokens.

The shipped presets are checked against their base models' published configs (the same
transformer, Kontext with FLUX.1 [dev]'s guidance embedding) and the sequence the trainers build
(twice the target's image tokens at equal size; Qwen-Image-Edit's prompt led by its reference's
vision tokens); models of the presets' code paths at a CPU's size hold the same allocations on the
`simulate` backend as on the `cpu` one, cached and with the encoders online and a validation
image; each trainer's export writes its own layout of the pairs, or refuses in one line.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import assert_fake_equals_real, refusal, spec
from test_chroma import TINY_T5, TINY_VAE
from test_export import (
    _options,
    _shell_words,
    point_for,
    workdir,  # noqa: F401 (its fixed studies under results/, a fixture)
)
from test_qwen_image import TINY_QWEN, TINY_VL
from test_qwen_image import TINY_VAE as TINY_QWEN_VAE

from autofit.backends import simulate
from autofit.errors import AutofitError
from autofit.export import TARGETS
from autofit.export.point import StudyPoint
from autofit.families import REGISTRY, musubi
from autofit.models import load_preset
from autofit.records.probe import ProbeSpec
from autofit.workloads import workload_for

# FLUX.1's double and single blocks at a width a CPU steps in a second; CLIP-L likewise.
TINY_FLUX = {
    "num_attention_heads": 2, "attention_head_dim": 16, "axes_dims_rope": [4, 6, 6],
    "num_layers": 1, "num_single_layers": 1, "joint_attention_dim": 32,
    "pooled_projection_dim": 32,
}  # fmt: skip
TINY_CLIP = {
    "vocab_size": 500, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
    "num_attention_heads": 2, "projection_dim": 32,
}  # fmt: skip


def tiny_kontext(backend: str = "simulate", **knobs: Any) -> ProbeSpec:
    """flux_kontext_dev's probe (batch 2 at 64 px unless `knobs` say otherwise) on a FLUX.1 of
    TINY_FLUX's widths; the VAE compresses 2x, so a 64 px target and its reference are 256 tokens
    each after the 2x2 packing."""
    probe = spec(
        "flux_kontext_dev", backend=backend, **{"batch_size": 2, "resolution": 64, **knobs}
    )
    model = copy.deepcopy(probe.model)
    model["architecture"].update(TINY_FLUX)
    model["inputs"].update(
        clip_tokens=8, t5_tokens=16, text_dim=32, pooled_dim=32, latent_downsample=2
    )
    companions = model["companions"]
    companions["text_encoder"]["architecture"].update(TINY_CLIP)
    companions["text_encoder_2"]["architecture"].update(TINY_T5)
    companions["vae"]["architecture"].update(TINY_VAE)
    return dataclasses.replace(probe, model=model)


def tiny_qwen_edit(backend: str = "simulate", **knobs: Any) -> ProbeSpec:
    """qwen_image_edit's probe (batch 2 of 64 px pairs unless `knobs` say otherwise) on a
    Qwen-Image of TINY_QWEN's widths, its prompt 8 vision tokens and 16 caption tokens after a
    4-token template."""
    probe = spec("qwen_image_edit", backend=backend, **{"batch_size": 2, "resolution": 64, **knobs})
    model = copy.deepcopy(probe.model)
    model["architecture"].update(TINY_QWEN)
    model["inputs"].update(text_tokens=16, vision_tokens=8, template_tokens=4, text_dim=32)
    encoder = model["companions"]["text_encoder"]["architecture"]
    for part, sizes in TINY_VL.items():
        encoder[part].update(sizes)
    model["companions"]["vae"]["architecture"].update(TINY_QWEN_VAE)
    return dataclasses.replace(probe, model=model)


def test_the_edit_models_are_their_base_models_transformers() -> None:
    """Kontext's config is FLUX.1 [dev]'s, guidance embedding included (musubi-tuner's
    configs_flux_dev_context); Qwen-Image-Edit's is Qwen-Image's: the same parameters built
    (11.901 B, 20.430 B) and companions; what differs is their inputs' reference image."""
    for edit, base, count in (
        ("flux_kontext_dev", "flux_dev", 11_901_408_320),
        ("qwen_image_edit", "qwen_image", 20_430_401_088),
    ):
        preset, original = load_preset(edit), load_preset(base)
        assert preset.architecture == original.architecture
        assert preset.companions == original.companions
        assert preset.inputs["num_reference_images"] == 1
        assert "num_reference_images" not in original.inputs
        with torch.device("meta"):
            model = workload_for(preset).build_model(torch.bfloat16)
        assert sum(p.numel() for p in model.parameters()) == count
    assert load_preset("flux_kontext_dev").architecture["guidance_embeds"] is True


def _block_inputs(probe: ProbeSpec) -> dict[str, tuple[int, ...]]:
    """The shapes the first double block's image and text streams take in a simulated step."""
    seen: dict[str, tuple[int, ...]] = {}

    def record(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        seen.setdefault(
            "image", tuple(kwargs.get("hidden_states", args[0] if args else None).shape)
        )
        seen.setdefault("text", tuple(kwargs["encoder_hidden_states"].shape))

    original = torch.nn.Module.__call__

    def hooked(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if type(module).__name__ in ("FluxTransformerBlock", "QwenImageTransformerBlock"):
            record(module, args, kwargs)
        return original(module, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.nn.Module, "__call__", hooked)
        simulate.trace(probe)
    return seen


def test_the_reference_doubles_the_image_sequence_and_qwen_reads_its_vision_tokens() -> None:
    kontext = _block_inputs(tiny_kontext(train_mode="lora"))
    assert kontext["image"][:2] == (
        2,
        2 * 32 * 32 // 4,
    )  # the target's 256 tokens, then its reference's
    assert kontext["text"][:2] == (2, 16)
    qwen = _block_inputs(tiny_qwen_edit(train_mode="lora"))
    assert qwen["image"][:2] == (
        2,
        2 * 8 * 8 // 4,
    )  # 64 px by the 8x VAE: 8x8 latents, 16 tokens each
    assert qwen["text"][:2] == (2, 8 + 16)  # the reference's vision tokens, then the caption's


def test_the_published_presets_sequence_at_1024() -> None:
    """At 1024x1024, 4,096 target tokens and 4,096 reference tokens; Qwen-Image-Edit's prompt
    embedding holds the reference's 1,369 vision tokens and their two markers before the caption."""
    for name in ("flux_kontext_dev", "qwen_image_edit"):
        workload = workload_for(load_preset(name))
        latents = workload.latent_shape(1, 1024)
        batch = workload.make_batch(1, 1024, torch.device("meta"), torch.bfloat16)
        assert batch["references"].shape == (1, 1, *latents[1:])
        assert workload.reference_tokens(batch["references"]).shape == (1, 4096, 64)
    qwen = workload_for(load_preset("qwen_image_edit"))
    assert qwen.prompt_tokens == 1371 + 512


@pytest.mark.parametrize(
    "build, knobs",
    [
        (tiny_kontext, dict(train_mode="lora", checkpointing=True, batch_size=1, resolution=32)),
        (
            tiny_kontext,
            dict(
                train_mode="lora", encoders="online", validation="on", batch_size=1, resolution=32
            ),
        ),
        (tiny_qwen_edit, dict(train_mode="lora", checkpointing=True, batch_size=1, resolution=32)),
    ],
    ids=["kontext-lora", "kontext-online-validation", "qwen-edit-lora"],
)
def test_simulated_allocations_equal_real_ones(build: Any, knobs: dict[str, Any]) -> None:
    assert_fake_equals_real(build(**knobs))


def test_a_pair_holds_more_than_its_target_alone() -> None:
    """The reference's tokens go through every block: the step of a pair peaks above the step of
    the same model on its target alone."""

    def peak(probe: ProbeSpec) -> int:
        _, log = simulate.trace(probe)
        return log.peak_report().peak_allocated_bytes

    pair = tiny_kontext(train_mode="lora")
    alone = copy.deepcopy(pair.model)
    del alone["inputs"]["num_reference_images"]
    assert peak(pair) > peak(dataclasses.replace(pair, model=alone))


# --- the trainers ----------------------------------------------------------------------------


def _point(model: str, precision: str = "bf16_autocast", targets: str = "preset") -> StudyPoint:
    """A measured LoRA run of `model` to export (the fixed FLUX.1 study's best point, its model
    replaced), at 1024 px with cached encoders."""
    from test_export import FLUX

    point = point_for("ai_toolkit", FLUX, None)
    values = {**point.config, "train_mode": "lora", "resolution": 1024, "swap_blocks": 0}
    values.update(precision=precision, lora_targets=targets, encoders="cached")
    return dataclasses.replace(point, preset=load_preset(model), config=values)


def test_the_families_trainers_or_their_refusals() -> None:
    kontext, qwen = REGISTRY["flux_kontext"], REGISTRY["qwen_image_edit"]
    assert (
        kontext.trainer("diffusers").scripts["lora"].file == "train_dreambooth_lora_flux_kontext.py"
    )
    assert kontext.trainer("musubi").script.endswith("flux_kontext_train_network.py")
    assert kontext.trainer("simpletuner").model_family == "flux"
    assert load_preset("flux_kontext_dev").trainers["simpletuner"] == {"model_flavour": "kontext"}
    assert musubi("qwen_image_edit").flags == ("--model_version", "edit")
    assert load_preset("qwen_image_edit").trainers["simpletuner"] == {"model_flavour": "edit-v1"}
    for family, target in [(kontext, "kohya"), (kontext, "ai_toolkit"), (qwen, "diffusers"),
                           (qwen, "kohya"), (qwen, "ai_toolkit")]:  # fmt: skip
        assert family.trainer(target) is None, (family.name, target)
    # musubi-tuner swaps N//2 double and (N - N//2) * 2 + 1 single blocks, two of each kept
    assert refusal({"train_mode": "lora", "swap_blocks": 34}, "flux_kontext_dev") is None


@pytest.mark.usefixtures("workdir")
def test_musubi_writes_the_control_images_and_the_edit_model_version(tmp_path: Path) -> None:
    import tomllib

    for model, script in (
        ("flux_kontext_dev", "src/musubi_tuner/flux_kontext_train_network.py"),
        ("qwen_image_edit", "src/musubi_tuner/qwen_image_train_network.py"),
    ):
        files = TARGETS["musubi"].run(_point(model, "bf16", "all_linear"), tmp_path / model).files
        dataset = tomllib.loads(files["dataset.toml"])
        assert dataset["datasets"][0]["control_directory"] == "path/to/control_images"
        words = _shell_words(files["train.sh"])
        assert script in words
        cache = [
            _shell_words(line)
            for line in files["cache.sh"].splitlines()
            if line.startswith("python ")
        ]
        if model == "qwen_image_edit":
            assert _options(words)["--model_version"] == ["edit"]
            assert all(_options(line)["--model_version"] == ["edit"] for line in cache)
        else:
            assert "--model_version" not in words
            assert {"--text_encoder1", "--text_encoder2"} <= set(_options(cache[1]))


@pytest.mark.usefixtures("workdir")
def test_simpletuner_pairs_a_conditioning_dataset(tmp_path: Path) -> None:
    import json

    for model, flavour, targets in (
        ("flux_kontext_dev", "kontext", "joint_attention"),
        ("qwen_image_edit", "edit-v1", "attention"),
    ):
        files = TARGETS["simpletuner"].run(_point(model, targets=targets), tmp_path / model).files
        assert json.loads(files["config.json"])["model_flavour"] == flavour
        images, reference, _ = json.loads(files["multidatabackend.json"])
        assert images["conditioning_data"] == [reference["id"]]
        assert reference["dataset_type"] == "conditioning"
        assert reference["conditioning_type"] == "reference_strict"
        assert {k: reference[k] for k in ("resolution", "crop_aspect")} == {
            k: images[k] for k in ("resolution", "crop_aspect")
        }


@pytest.mark.usefixtures("workdir")
def test_diffusers_reads_kontext_pairs_from_dataset_columns(tmp_path: Path) -> None:
    point = _point("flux_kontext_dev", "bf16", "joint_attention")
    words = _shell_words(TARGETS["diffusers"].run(point, tmp_path / "cached").files["launch.sh"])
    assert "examples/dreambooth/train_dreambooth_lora_flux_kontext.py" in words
    assert {"--cond_image_column=cond_image", "--image_column=image", "--cache_latents"} <= set(
        words
    )
    online = dataclasses.replace(point, config={**point.config, "encoders": "online"})
    words = _shell_words(TARGETS["diffusers"].run(online, tmp_path / "online").files["launch.sh"])
    assert "--cond_image_column=cond_image" in words and "--cache_latents" not in words
    with pytest.raises(AutofitError, match="cannot train qwen_image_edit"):
        TARGETS["diffusers"].run(_point("qwen_image_edit"), tmp_path / "qwen")
