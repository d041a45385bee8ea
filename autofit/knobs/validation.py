"""validation: a validation image after training, with the training state still resident.

Trainers render validation images every so often in the middle of training: the weights,
optimizer state and whatever else training keeps stay on the GPU while the inference pipeline
encodes the prompt, runs its denoiser step (classifier-free guidance doubles its batch) and the
VAE decodes the latents at the training resolution. A run can fit its training steps and still run
out of memory here; then the probe is `oom` in phase `validation`. With cached encoders the
pipeline loads the text encoders and the VAE onto the GPU for the pass, in their own dtypes, as
the diffusers scripts' pipelines do, and drops them after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.trainers import diffusers_script

if TYPE_CHECKING:
    from autofit.run_state import RunState

PROMPT = "a photo"  # a placeholder the export's notes ask the user to replace
EVERY = 100  # steps between validations in the exported configs


def _simpletuner(value: Any, s: Subject) -> Say:
    if value != "on":
        return say(validation_disable=True)
    resolution = s.config["resolution"]
    return say(
        note="validation_prompt is a placeholder: put a prompt of your own",
        validation_disable=False,
        validation_prompt=PROMPT,
        validation_resolution=f"{resolution}x{resolution}",
        validation_step_interval=EVERY,
    )


def _kohya(value: Any, s: Subject) -> Say:
    if value != "on":
        return Say()
    resolution = s.config["resolution"]
    return Say(
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
    if value != "on":
        return Say()
    settings: dict[str, Any] = {"--validation_prompt": PROMPT}
    script = diffusers_script(s.family, s.config["train_mode"])
    if script is not None and script.validation_holds_more:
        return Refuse(f"{script.file} {script.validation_holds_more}")
    if script is not None and script.kind == "controlnet":
        settings.update(
            {"--validation_image": "path/to/conditioning.png", "--validation_steps": EVERY}
        )
    return Say(
        settings=settings,
        note="--validation_prompt (and --validation_image) are placeholders: put your own",
    )


class Validation(Knob):
    name = "validation"
    default = "off"
    help = "a validation pass after training: off | on"
    values = {
        "off": "no validation images",
        "on": "render validation images during training",
    }
    per_sample_memory = False
    reads = ("companions",)  # the pipeline reuses resident encoders and VAE

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value == "on" and "vae" not in context.model.companions:
            return f"validation=on decodes with the model's VAE, which {context.model.name} does not list"
        return None

    def after_training(self, run: RunState, value: Any) -> None:
        if value != "on":
            return
        import torch

        from autofit.workloads.companions import build_companion

        with run.in_phase("validation"), torch.no_grad():
            loaded = {}  # what the pipeline loads besides the resident companions
            for name in ("vae", *run.workload.text_encoders):
                if name not in run.companions and name in run.preset.companions:
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
        },
        "diffusers": _diffusers,
    }
