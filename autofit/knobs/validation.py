"""validation: a validation image after training, with the training state still resident.

Trainers render validation images every so often in the middle of training: the weights,
optimizer state and whatever else training keeps stay on the GPU while the inference pipeline
encodes the prompt, runs its denoiser step (classifier-free guidance doubles its batch) and the
VAE decodes the latents at the training resolution. A run can fit its training steps and still run
out of memory here; then the probe is `oom` in phase `validation`. With cached encoders the
pipeline loads the text encoders and the VAE onto the GPU for the pass, in their own dtypes, as
the diffusers scripts' pipelines do, and drops them after it. `reload` is a pipeline that loads
its own text encoders even where training holds a pair on the GPU (diffusers' Flux LoRA script):
two pairs at once for the pass. `offload` is the fix users apply, diffusers'
`enable_model_cpu_offload()`: the pipeline runs the trained model (and a ControlNet's frozen base)
where training holds it, and what it loads waits in host memory, each component copied to the GPU
only while it runs (autofit/workloads/pipeline.py): one at a time beside the training state, for
copies over the host link. Under autocast a copy leaves its 16-bit casts behind until the
pipeline call returns (autocast caches the casts of weights that require grad, keyed by the
weight, not by where its data is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autofit.families import COMPANION_LIBRARIES, DiffusersScript, diffusers_script, kohya
from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.knobs.validation_resolution import validation_pixels

if TYPE_CHECKING:
    from autofit.run_state import RunState

PROMPT = "a photo"  # a placeholder the export's notes ask the user to replace
EVERY = 100  # steps between validations in the exported configs


# What a trainer whose validation reuses the encoders training holds says to `reload`: the same
# pass in less memory than measured.
REUSES = (
    "its validation reuses the text encoders training holds: less memory than the measured reload"
)


def _offloaded_here(s: Subject) -> bool:
    """Whether validation=offload has something to offload: with encoders=online training holds
    the text encoders and VAE on the GPU, and the pipeline runs them there."""
    return s.config.get("encoders") != "online"


def _simpletuner(value: Any, s: Subject) -> Say | Refuse:
    if value == "off":
        return say(validation_disable=True)
    if value == "offload":
        # Its OPTIONS.md names --enable_model_cpu_offload, but no argument defines it (2026-08).
        return Refuse(
            "SimpleTuner moves its validation pipeline, VAE included, to the GPU whole: it has no "
            "model CPU offload for validation"
        )
    resolution = validation_pixels(s.config, s.preset.resolution)
    return say(
        warning=REUSES if value == "reload" else "",
        note="validation_prompt is a placeholder: put a prompt of your own",
        validation_disable=False,
        validation_prompt=PROMPT,
        validation_resolution=f"{resolution}x{resolution}",
        validation_step_interval=EVERY,
    )


def _kohya(value: Any, s: Subject) -> Say | Refuse:
    if value == "off":
        return Say()
    warning = REUSES if value == "reload" else ""
    if value == "offload" and _offloaded_here(s):
        # With cached text-encoder outputs and latents, sd-scripts moves its encoders and VAE to
        # the host: Flux and SD3 sampling (flux/sd3_train_utils.sample_images) uses prompts encoded
        # before training and moves the VAE in for the decode alone; SDXL sampling
        # (train_util.sample_images_common) moves the VAE in before the denoising.
        scripts = kohya(s.family)
        if scripts is not None and scripts.sampling_moves_vae_first:
            return Refuse(
                "sd-scripts' SDXL sampling moves the VAE to the GPU before the denoising, not only "
                "for the decode"
            )
        warning = (
            "sd-scripts encodes its sample prompts before training and moves the VAE to the GPU "
            "only for the decode: less memory than the measured offload"
        )
    resolution = validation_pixels(s.config, s.preset.resolution)
    return Say(
        warning=warning,
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


def _diffusers(value: Any, s: Subject) -> Say | Refuse | None:
    if value == "off":
        return Say()
    settings: dict[str, Any] = {"--validation_prompt": PROMPT}
    script = diffusers_script(s.family, s.config["train_mode"])
    if value == "offload":
        return _diffusers_offload(script)
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


def _diffusers_offload(script: DiffusersScript | None) -> Refuse | None:
    if script is None:
        return None  # no script trains this: train_mode says so
    if script.kind == "controlnet":  # since diffusers fd02aad (2025-04-09)
        return Refuse(
            f"{script.file} has no offload flag: its validation encodes the prompts with a second "
            "set of text encoders on the GPU together, then runs a pipeline with "
            "enable_model_cpu_offload that loads a transformer of its own"
        )
    why = f"{script.file} moves its validation pipeline to the GPU whole"
    if script.file == "train_dreambooth_lora_sana.py":
        why += (
            "; its --offload keeps the VAE and text encoder training uses on the host between uses"
        )
    return Refuse(why)


def _sana(value: Any, s: Subject) -> Say:
    if value == "off":
        return say(**{"train.visualize": False})
    warning = REUSES if value == "reload" else ""
    if value == "offload" and _offloaded_here(s):
        # train.py encodes its validation prompts before training ("for saving GPU memory") and,
        # without a VAE of training's, loads one after the denoising for the decode.
        warning = (
            "Sana's train.py encodes its validation prompts before training and loads the VAE "
            "for the decode alone: less memory than the measured offload"
        )
    return say(
        warning=warning,
        note=f"validation={value}: train.visualize renders train.validation_prompts every "
        "eval_sampling_steps",
        **{"train.visualize": True},
    )


class Validation(Knob):
    name = "validation"
    depends_on = ("encoders", "resolution", "train_mode", "validation_resolution")
    default = "off"
    help = (
        "a validation pass after training: off | on | reload (with a second pair of text "
        "encoders) | offload (what the pipeline loads kept in host memory until it runs)"
    )
    values = {
        "off": "no validation images",
        "on": "render validation images during training",
        "reload": "render validation images during training, the pipeline loading its own text encoders",
        "offload": "render validation images during training with model CPU offload (diffusers' "
        "enable_model_cpu_offload): the pipeline runs the trained model where training holds it "
        "and moves each text encoder and VAE it loads to the GPU only while that one runs",
    }
    per_sample_memory = False
    reach = "outside_pass"  # it runs after training
    reads = ("companions",)  # the pipeline reuses resident encoders and VAE

    def libraries(self, value: Any) -> tuple[str, ...]:
        return () if value == "off" else COMPANION_LIBRARIES  # the pipeline loads its own

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value != "off" and "vae" not in context.model.companions:
            return f"validation={value} decodes with the model's VAE, which {context.model.name} does not list"
        return None

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        return "on" if value == "offload" else None  # the same pass, with copies over the link

    def after_training(self, run: RunState, value: Any) -> None:
        if value == "off":
            return
        import torch

        # lazy: the knobs load without torch (docs/contributing.md)
        from autofit.workloads.companions import build_companion
        from autofit.workloads.pipeline import Pipeline

        with run.in_phase("validation"), torch.no_grad():
            pipeline = Pipeline(run, offload=value == "offload")
            for name in ("vae", *run.workload.text_encoders):
                if name not in run.preset.companions:
                    continue
                spec = run.preset.companions[name]
                reloaded = value == "reload" and name != "vae"
                if reloaded or name not in run.companions:
                    pipeline.components[name] = pipeline.load(
                        lambda spec=spec: build_companion(spec)
                    )
                else:  # resident: training holds it on the GPU
                    pipeline.components[name] = run.companions[name]
            run.model.eval()
            try:
                with run.forward_contexts():
                    run.workload.validate(run, pipeline)
            finally:
                run.model.train()

    trainers = {
        "simpletuner": _simpletuner,
        "kohya": _kohya,
        "sana": _sana,
        "diffusers": _diffusers,
        # ai-toolkit samples images (its `sample` section) before training and every
        # sample_every steps with what training holds, unless told not to.
        "ai_toolkit": {
            "off": say(**{"train.disable_sampling": True, "train.skip_first_sample": True}),
            **dict.fromkeys(
                ("on", "reload", "offload"),
                Refuse(
                    "autofit has not matched ai-toolkit's sampling (its flowmatch sampler over "
                    "the sample section's prompts, 20 or more steps, with the LoRA unmerged)"
                ),
            ),
        },
        # OneTrainer samples from its sample definitions every sample_after (10 minutes unless
        # told) and can compute a validation loss on validation concepts (`validation`).
        "onetrainer": {
            "off": say(sample_after_unit="NEVER", validation=False),
            **dict.fromkeys(
                ("on", "reload", "offload"),
                Refuse(
                    "autofit has not matched OneTrainer's sampling (its sample definitions file, "
                    "sampled with the model as it trains)"
                ),
            ),
        },
    }
