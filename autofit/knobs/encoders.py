"""encoders: whether the frozen text encoders and VAE sit on the GPU and run every step.

- `cached`: latents and text embeddings were computed beforehand (trainers' caching); only the
  trained model is on the GPU, unless the family's trainer leaves some companions there anyway
  (`Workload.resident_when_cached`).
- `online`: the companions of the preset (its text encoders and VAE) sit on the GPU in their own
  dtype and encode every batch without gradients, as a trainer that does not cache runs them.
- `text`: the latents were computed beforehand, the text encoders sit on the GPU in their own
  dtype and encode every batch's prompts (sd-scripts' cache_latents without
  cache_text_encoder_outputs, SimpleTuner's text_cache_ondemand, ai-toolkit's latent cache with
  its text encoders loaded): no VAE on the GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autofit.families import COMPANION_LIBRARIES, diffusers_script, kohya
from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.models import ModelPreset
from autofit.trainers import DATA_DIR

if TYPE_CHECKING:
    from autofit.run_state import RunState


def _diffusers(value: Any, s: Subject) -> Say | Refuse | None:
    """How each example script treats the frozen encoders decides which value it reproduces:
    the dreambooth LoRA scripts cache latents and encode one instance prompt before training
    (cached; Flux's still holds its text encoders, so only online) or encode a captioned dataset
    every step (online); the full fine-tune dreambooth
    scripts encode with the VAE every step; train_text_to_image_sdxl.py precomputes latents and
    embeddings, its LoRA sibling encodes every step; train_controlnet_sd3.py precomputes the
    embeddings and encodes latents every step."""
    script = diffusers_script(s.family, s.config["train_mode"])
    if script is None:
        return None  # no script trains this: train_mode says so
    if s.preset.inputs.get("num_reference_images") and value in ("cached", "online"):
        return _diffusers_pairs(value, script.encoders)
    if value in script.encoders:
        if script.kind == "dreambooth" and value == "cached":
            return say(
                note="--instance_prompt is a placeholder: the prompt your images are trained with",
                **{"--cache_latents": True, "--instance_data_dir": DATA_DIR,
                   "--instance_prompt": "a photo"},
            )  # fmt: skip
        if script.kind == "dreambooth":
            return say(
                note=f"'{DATA_DIR}' is an imagefolder dataset with a 'text' caption column",
                **{"--dataset_name": DATA_DIR, "--caption_column": "text"},
            )
        return Say()
    if value == "text":
        return Refuse(
            f"autofit has not matched {script.file}'s latent cache with prompts encoded every "
            "step (encoders=text)"
        )
    if value == "online":
        # The script frees (some) encoders the measured run kept: less memory, same training.
        return Say(warning=f"{script.file} precomputes text embeddings and frees the text encoders")
    return Refuse(f"{script.file} {script.not_cached}")


def _diffusers_pairs(value: str, encoders: tuple[str, ...]) -> Say:
    """An editing model's script (train_dreambooth_lora_flux_kontext.py) reads its pairs from a
    dataset's columns only (--cond_image_column asserts --dataset_name, --image_column and
    --caption_column), precomputes the captions' embeddings and frees the text encoders; its
    --cache_latents encodes both images' latents before training (cached), or its VAE encodes
    them every step (online, the text encoders freed all the same)."""
    columns = {
        "--dataset_name": DATA_DIR, "--image_column": "image", "--caption_column": "text",
        "--cond_image_column": "cond_image",
    }  # fmt: skip
    note = (
        f"'{DATA_DIR}' is an imagefolder dataset with 'image', 'cond_image' (the reference) and "
        "'text' columns"
    )
    if value in encoders:
        return say(note=note, **columns, **{"--cache_latents": True})
    return say(
        note=note,
        warning="the script precomputes the captions' embeddings and frees the text encoders",
        **columns,
    )


def _kohya(value: Any, s: Subject) -> Say | Refuse:
    """Cached: latents and text-encoder outputs computed before training and kept on disk, where
    the family's scripts cache text-encoder outputs; SD 1.x/2.x's keep the text encoder on the
    GPU (encoders=text)."""
    scripts = kohya(s.family)
    if value == "cached" and scripts is not None and not scripts.text_encoder_cache:
        return Refuse(
            f"sd-scripts' {scripts.lora} and {scripts.full} have no text-encoder output cache: "
            "the text encoder stays on the GPU (encoders=text caches the latents only)"
        )
    cache_text = value == "cached"
    return say(
        cache_latents=value != "online",
        cache_latents_to_disk=value != "online",
        **({"cache_text_encoder_outputs": cache_text, "cache_text_encoder_outputs_to_disk": cache_text}
           if scripts is None or scripts.text_encoder_cache else {}),
    )  # fmt: skip


MUSUBI_CACHES = (
    "musubi-tuner trains only on the latents and text-encoder outputs its caching scripts wrote "
    "before training"
)


def _text_encoders(preset: ModelPreset) -> list[str]:
    """The companions that encode the prompt (the family's workload names them)."""
    return [name for name in preset.companions if name.startswith("text_encoder")]


class Encoders(Knob):
    name = "encoders"
    depends_on = ("batch_size", "resolution", "train_mode")
    decided_by_trainer = True
    default = "cached"
    help = (
        "frozen text encoders and VAE: cached (precomputed) | online (on the GPU) | text (latents "
        "cached, the text encoders on the GPU)"
    )
    values = {
        "cached": "latents and text embeddings computed beforehand; only the trained model on the GPU",
        "online": "the text encoders and VAE on the GPU, encoding every batch",
        "text": "latents computed beforehand; the text encoders on the GPU, encoding every batch's prompts",
    }
    # Caching is work the user's data pipeline does: said even at the default.
    default_asks_nothing = False
    reads = ("dtypes",)
    writes = ("companions", "batch_source")

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return bool(preset.companions)  # nothing to cache without frozen encoders

    def libraries(self, value: Any) -> tuple[str, ...]:
        # (a family whose trainer keeps some resident when cached imports them itself)
        return COMPANION_LIBRARIES if value in ("online", "text") else ()

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value == "online" and "vae" not in context.model.companions:
            return f"encoders=online needs the model's text encoders and VAE, which {context.model.name} does not list"
        if value == "text" and not _text_encoders(context.model):
            return f"encoders=text runs the model's text encoders, which {context.model.name} does not list"
        return None

    def apply(self, run: RunState, value: Any) -> None:
        online = value in ("online", "text")
        if value == "text":
            names = _text_encoders(run.preset)
        else:
            names = list(run.preset.companions) if online else run.workload.resident_when_cached
        if not names:
            return
        # lazy: the knobs load without torch (docs/contributing.md)
        from autofit.workloads.companions import build_companion

        # online: each in its own dtype; left resident by the trainer: in the weight dtype
        dtype = None if online else run.dtypes.frozen
        for name in names:
            with run.device:
                run.add_companion(name, build_companion(run.preset.companions[name], dtype))
        if not online:
            return
        knobs, workload = run.knobs, run.workload

        def encoded_batch() -> dict[str, Any]:
            raw = workload.make_raw_batch(knobs["batch_size"], knobs["resolution"], run.device)
            return workload.encode(raw, run.companions, run.dtypes.weights)

        def prompts_encoded() -> dict[str, Any]:
            # the prompts encoded first, then the cached latents (and any cached condition the
            # prompts do not give) loaded beside them
            import torch

            size, resolution, dtype = knobs["batch_size"], knobs["resolution"], run.dtypes.weights
            with torch.no_grad():
                encoded = workload.encode_text(workload.tokens(size, run.device), run.companions)
            batch = workload.make_batch(size, resolution, run.device, dtype)
            batch.update(
                {k: v.to(dtype) if v.is_floating_point() else v for k, v in encoded.items()}
            )
            return batch

        run.batch_source = encoded_batch if value == "online" else prompts_encoded

    trainers = {
        # SimpleTuner caches latents and text embeddings before training unless told to encode
        # on demand, which keeps the VAE and text encoders on the GPU.
        "simpletuner": {
            "cached": say(vae_cache_ondemand=False, text_cache_ondemand=False),
            "online": say(vae_cache_ondemand=True, text_cache_ondemand=True),
            "text": say(vae_cache_ondemand=False, text_cache_ondemand=True),
        },
        "kohya": _kohya,
        # Precomputed DC-AE latents and Gemma features: no VAE or text encoder on the GPU.
        "sana": {
            "cached": say(
                note="encoders=cached: point data.data_dir at a dataset with precomputed DC-AE "
                "latents and text features (Sana's load_vae_feat / load_text_feat)",
                **{"data.load_vae_feat": True, "data.load_text_feat": True},
            ),
            "online": say(**{"data.load_vae_feat": False, "data.load_text_feat": False}),
            "text": say(**{"data.load_vae_feat": True, "data.load_text_feat": False}),
        },
        "diffusers": _diffusers,
        # musubi-tuner trains on latents and text-encoder outputs its caching scripts wrote
        # beforehand (the export writes their commands); its training loads neither encoder.
        "musubi": {
            "cached": Say(),
            "online": Refuse(MUSUBI_CACHES),
            "text": Refuse(MUSUBI_CACHES),
        },
        # ai-toolkit 27a03a91: a dataset's cache_latents_to_disk encodes every latent before
        # training and leaves the VAE off the GPU; train.cache_text_embeddings does the same for
        # the prompts and unloads the text encoders (jobs/process/BaseSDTrainProcess.py).
        "ai_toolkit": {
            "cached": say(
                **{"dataset.cache_latents_to_disk": True, "train.cache_text_embeddings": True}
            ),
            "online": say(
                **{"dataset.cache_latents_to_disk": False, "train.cache_text_embeddings": False}
            ),
            "text": say(
                **{"dataset.cache_latents_to_disk": True, "train.cache_text_embeddings": False}
            ),
        },
        # OneTrainer 23df3832: latent_caching encodes the latents and, for text encoders it does
        # not train, their outputs before training and leaves those models off the GPU; without
        # it they sit on the GPU and encode every step (modules/modelSetup/*LoRASetup.py
        # setup_train_device). It caches both or neither.
        "onetrainer": {
            "cached": say(latent_caching=True),
            "online": say(latent_caching=False),
            "text": Refuse(
                "OneTrainer's latent_caching caches the latents and the text encoders' outputs "
                "together"
            ),
        },
    }
