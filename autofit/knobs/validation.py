"""validation: a validation image after training, with the training state still resident.

Trainers render validation images every so often in the middle of training: the weights,
optimizer state and whatever else training keeps stay on the GPU while the inference pipeline
encodes the prompt, runs its denoiser step (classifier-free guidance doubles its batch) and the
VAE decodes the latents at the training resolution. A run can fit its training steps and still run
out of memory here; then the probe is `oom` in phase `validation`. With cached encoders the
pipeline loads the text encoders and the VAE onto the GPU for the pass, in their own dtypes, as
the diffusers scripts' pipelines do, and drops them after it. `reload` is a pipeline that loads
its own text encoders even where training holds a pair on the GPU (diffusers' Flux LoRA script):
two pairs at once for the pass.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.knobs.validation_resolution import validation_pixels
from autofit.trainers import diffusers_script

if TYPE_CHECKING:
    from autofit.run_state import RunState

PROMPT = "a photo"  # a placeholder the export's notes ask the user to replace
EVERY = 100  # steps between validations in the exported configs


# What a trainer whose validation reuses the encoders training holds says to `reload`: the same
# pass in less memory than measured.
REUSES = (
    "its validation reuses the text encoders training holds: less memory than the measured reload"
)


def _simpletuner(value: Any, s: Subject) -> Say:
    if value == "off":
        return say(validation_disable=True)
    resolution = validation_pixels(s.config, s.preset.resolution)
    return say(
        warning=REUSES if value == "reload" else "",
        note="validation_prompt is a placeholder: put a prompt of your own",
        validation_disable=False,
        validation_prompt=PROMPT,
        validation_resolution=f"{resolution}x{resolution}",
        validation_step_interval=EVERY,
    )


def _kohya(value: Any, s: Subject) -> Say:
    if value == "off":
        return Say()
    resolution = validation_pixels(s.config, s.preset.resolution)
    return Say(
        warning=REUSES if value == "reload" else "",
        settings={
            "sample_prompts": str(s.out / "sample_prompts.txt"),
            "sample_every_n_steps": EVERY,
        },
        note="sample_prompts.txt holds a placeholder prompt: put your own",
        files={
            "sample_prompts.txt": (
                f"{PROMPT} --w {resolution} --h {resolution}",
                "sd-scripts sample prompts (validation images)",
            )
        },
    )


def _diffusers(value: Any, s: Subject) -> Say | Refuse:
    if value == "off":
        return Say()
    settings: dict[str, Any] = {"--validation_prompt": PROMPT}
    script = diffusers_script(s.family, s.config["train_mode"])
    reloads = script is not None and bool(script.validation_reloads)
    if value == "on" and reloads:
        assert script is not None
        return Refuse(f"{script.file} {script.validation_reloads} (validation=reload)")
    warning = "" if reloads or value == "on" else REUSES
    if script is not None and script.kind == "controlnet":
        settings.update(
            {"--validation_image": "path/to/conditioning.png", "--validation_steps": EVERY}
        )
    return Say(
        settings=settings,
        warning=warning,
        note="--validation_prompt (and --validation_image) are placeholders: put your own",
    )


class Validation(Knob):
    name = "validation"
    default = "off"
    help = (
        "a validation pass after training: off | on | reload (with a second pair of text encoders)"
    )
    values = {
        "off": "no validation images",
        "on": "render validation images during training",
        "reload": "render validation images during training, the pipeline loading its own text encoders",
    }
    per_sample_memory = False
    reads = ("companions",)  # the pipeline reuses resident encoders and VAE

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value != "off" and "vae" not in context.model.companions:
            return f"validation={value} decodes with the model's VAE, which {context.model.name} does not list"
        return None

    def after_training(self, run: RunState, value: Any) -> None:
        if value == "off":
            return
        import torch

        from autofit.workloads.companions import build_companion

        with run.in_phase("validation"), torch.no_grad():
            loaded = {}  # what the pipeline loads besides the resident companions
            for name in ("vae", *run.workload.text_encoders):
                reloaded = value == "reload" and name != "vae"
                if (reloaded or name not in run.companions) and name in run.preset.companions:
                    with run.device:
                        loaded[name] = build_companion(run.preset.companions[name]).eval()
            present = {**run.companions, **loaded}
            encoders = {
                n: present[n] for n in getattr(run.workload, "text_encoders", ()) if n in present
            }
            run.model.eval()
            try:
                with run.forward_contexts():
                    run.workload.validate(run, present["vae"], encoders)
            finally:
                run.model.train()

    trainers = {
        "simpletuner": _simpletuner,
        "kohya": _kohya,
        "sana": {
            "off": say(**{"train.visualize": False}),
            "on": say(
                note="validation=on: train.visualize renders train.validation_prompts every "
                "eval_sampling_steps",
                **{"train.visualize": True},
            ),
            "reload": say(
                warning=REUSES,
                note="validation=reload: train.visualize renders train.validation_prompts every "
                "eval_sampling_steps",
                **{"train.visualize": True},
            ),
        },
        "diffusers": _diffusers,
    }
