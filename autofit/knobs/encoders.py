"""encoders: whether the frozen text encoders and VAE sit on the GPU and run every step.

- `cached`: latents and text embeddings were computed beforehand (trainers' caching); only the
  trained model is on the GPU, unless the family's trainer leaves some companions there anyway
  (`Workload.resident_when_cached`).
- `online`: the companions of the preset (its text encoders and VAE) sit on the GPU in their own
  dtype and encode every batch without gradients, as a trainer that does not cache runs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autofit.families import COMPANION_LIBRARIES, diffusers_script
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
    if value == "online":
        # The script frees (some) encoders the measured run kept: less memory, same training.
        return Say(warning=f"{script.file} precomputes text embeddings and frees the text encoders")
    return Refuse(f"{script.file} {script.not_cached}")


class Encoders(Knob):
    name = "encoders"
    decided_by_trainer = True
    default = "cached"
    help = "frozen text encoders and VAE: cached (precomputed) | online (on the GPU)"
    values = {
        "cached": "latents and text embeddings computed beforehand; only the trained model on the GPU",
        "online": "the text encoders and VAE on the GPU, encoding every batch",
    }
    # Caching is work the user's data pipeline does: said even at the default.
    default_asks_nothing = False
    reads = ("dtypes",)
    writes = ("companions", "batch_source")

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return bool(preset.companions)  # nothing to cache without frozen encoders

    def libraries(self, value: Any) -> tuple[str, ...]:
        # (a family whose trainer keeps some resident when cached imports them itself)
        return COMPANION_LIBRARIES if value == "online" else ()

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value == "online" and "vae" not in context.model.companions:
            return f"encoders=online needs the model's text encoders and VAE, which {context.model.name} does not list"
        return None

    def apply(self, run: RunState, value: Any) -> None:
        online = value == "online"
        names = list(run.preset.companions) if online else run.workload.resident_when_cached
        if not names:
            return
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

        run.batch_source = encoded_batch

    trainers = {
        # SimpleTuner caches latents and text embeddings before training unless told to encode
        # on demand, which keeps the VAE and text encoders on the GPU.
        "simpletuner": {
            "cached": say(vae_cache_ondemand=False, text_cache_ondemand=False),
            "online": say(vae_cache_ondemand=True, text_cache_ondemand=True),
        },
        # Cached: latents and text-encoder outputs computed before training and kept on disk.
        "kohya": {
            value: say(
                cache_latents=value == "cached",
                cache_latents_to_disk=value == "cached",
                cache_text_encoder_outputs=value == "cached",
                cache_text_encoder_outputs_to_disk=value == "cached",
            )
            for value in ("cached", "online")
        },
        # Precomputed DC-AE latents and Gemma features: no VAE or text encoder on the GPU.
        "sana": {
            "cached": say(
                note="encoders=cached: point data.data_dir at a dataset with precomputed DC-AE "
                "latents and text features (Sana's load_vae_feat / load_text_feat)",
                **{"data.load_vae_feat": True, "data.load_text_feat": True},
            ),
            "online": say(**{"data.load_vae_feat": False, "data.load_text_feat": False}),
        },
        "diffusers": _diffusers,
    }
