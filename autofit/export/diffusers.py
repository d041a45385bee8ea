"""`target=diffusers`: the argument line for the matching diffusers example training script.

The script is the family's example in the diffusers repository (examples/...), launched with
`accelerate launch` and the accelerate config this target writes beside it (processes, mixed
precision, DeepSpeed for ZeRO). `launch.sh` holds the whole command.

How each script treats the frozen encoders decides which `encoders` value it can reproduce:
- dreambooth LoRA scripts (Sana, SD3, Flux): `--cache_latents` and one instance prompt encoded
  before training (encoders freed) = cached; a captioned dataset encoded every step = online;
- dreambooth full fine-tune scripts (SD3, Flux): the VAE encodes every step (no --cache_latents);
- train_text_to_image_sdxl.py precomputes latents and embeddings; its LoRA sibling encodes every
  step; train_controlnet_sd3.py precomputes embeddings and encodes latents every step.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from autofit.export.accelerate import accelerate_config, launch_prefix
from autofit.export.base import DATA_DIR, Plan, Target, weights


@dataclass(frozen=True)
class Script:
    path: str
    kind: str  # dreambooth | text_to_image | controlnet
    lora: bool
    # What the script does with the encoders: "cached", "online", or "mixed" (text embeddings
    # precomputed, latents encoded every step).
    encoders: tuple[str, ...]
    ema: bool = False


SCRIPTS = {
    ("sana", "lora"): Script("examples/dreambooth/train_dreambooth_lora_sana.py", "dreambooth", True, ("cached", "online")),
    ("sd3", "full"): Script("examples/dreambooth/train_dreambooth_sd3.py", "dreambooth", False, ("online",)),
    ("sd3", "lora"): Script("examples/dreambooth/train_dreambooth_lora_sd3.py", "dreambooth", True, ("cached", "online")),
    ("flux", "full"): Script("examples/dreambooth/train_dreambooth_flux.py", "dreambooth", False, ("online",)),
    ("flux", "lora"): Script("examples/dreambooth/train_dreambooth_lora_flux.py", "dreambooth", True, ("cached", "online")),
    ("sdxl", "full"): Script("examples/text_to_image/train_text_to_image_sdxl.py", "text_to_image", False, ("cached",), ema=True),
    ("sdxl", "lora"): Script("examples/text_to_image/train_text_to_image_lora_sdxl.py", "text_to_image", True, ("online",)),
    ("sd3_controlnet", "full"): Script("examples/controlnet/train_controlnet_sd3.py", "controlnet", False, ("mixed",)),
}  # fmt: skip


def _script(plan: Plan) -> Script:
    family, mode = plan.point.family, plan.value("train_mode")
    script = SCRIPTS.get((family, mode))
    if script is None:
        offered = ", ".join(m for f, m in SCRIPTS if f == family)
        plan.refuse(
            "train_mode",
            f"the diffusers examples train {plan.point.family} only as: {offered}",
        )
    return script


def _encoders(plan: Plan, script: Script, args: list[str]) -> None:
    encoders = plan.value("encoders")
    name = script.path.rsplit("/", 1)[-1]
    if encoders in script.encoders:
        if script.kind == "dreambooth" and encoders == "cached":
            args += [
                "--cache_latents",
                f"--instance_data_dir={DATA_DIR}",
                "--instance_prompt=a photo",
            ]
            plan.note("--instance_prompt is a placeholder: the prompt your images are trained with")
        elif script.kind == "dreambooth":
            args += [f"--dataset_name={DATA_DIR}", "--caption_column=text"]
            plan.note(f"'{DATA_DIR}' is an imagefolder dataset with a 'text' caption column")
        return
    if encoders == "online":
        # The script frees (some) encoders the measured run kept: less memory, same training.
        plan.warn("encoders", f"{name} precomputes text embeddings and frees the text encoders")
        return
    plan.refuse("encoders", f"{name} encodes latents with the VAE on the GPU every step")


def _data(script: Script, args: list[str], plan: Plan) -> None:
    if script.kind == "text_to_image":
        args += [f"--train_data_dir={DATA_DIR}", "--caption_column=text"]
    elif script.kind == "controlnet":
        args += [f"--train_data_dir={DATA_DIR}", "--conditioning_image_column=conditioning_image"]
    if script.kind != "dreambooth":
        plan.note(f"'{DATA_DIR}' is an imagefolder dataset with the script's columns")


def _optimizer(plan: Plan, script: Script, args: list[str]) -> None:
    optimizer = plan.value("optimizer")
    if optimizer not in ("adamw", "adamw8bit"):
        plan.refuse(
            "optimizer",
            "the diffusers example scripts offer AdamW, 8-bit AdamW (--use_8bit_adam) and Prodigy",
        )
    if script.kind == "dreambooth":
        args.append("--optimizer=AdamW")
    if optimizer == "adamw8bit":
        args.append("--use_8bit_adam")
    else:
        plan.warn(
            "optimizer",
            "the script builds torch.optim.AdamW without fused=True; on a GPU torch then steps "
            "with its foreach kernels, which hold temporary copies of the states the measured "
            "fused step did not (headroom up to one state's size: small for LoRA)",
        )


def _extras(plan: Plan, script: Script, args: list[str]) -> None:
    ema = plan.value("ema")
    if ema == "gpu" and script.ema:
        args.append("--use_ema")
    elif ema != "off":
        where = "on the GPU only (--use_ema)" if script.ema else "none"
        plan.refuse("ema", f"{script.path.rsplit('/', 1)[-1]} keeps an EMA copy {where}")
    if plan.value("swap_blocks"):
        plan.refuse("swap_blocks", "the diffusers example scripts have no block swap")
    if plan.value("attention") == "math":
        plan.warn(
            "attention",
            "the script runs diffusers' default attention processor (torch's fused SDPA), which "
            "holds less than the measured math path",
        )
    if plan.value("validation") == "on":
        args.append("--validation_prompt=a photo")
        if script.kind == "controlnet":
            args += ["--validation_image=path/to/conditioning.png", "--validation_steps=100"]
        plan.note("--validation_prompt (and --validation_image) are placeholders: put your own")


class Diffusers(Target):
    name = "diffusers"
    summary = (
        "the argument line for the matching diffusers example script, with an accelerate config"
    )
    families = {family: script.path for (family, _), script in SCRIPTS.items()}

    def build(self, plan: Plan) -> None:
        import yaml

        point = plan.point
        script = _script(plan)
        rank = plan.value("lora_rank")
        if point.config["precision"] == "bf16_pure":
            plan.refuse(
                "precision",
                "the diffusers example scripts keep the trained weights in fp32 (LoRA adapters "
                "too) under --mixed_precision; they have no bf16-weight mode",
            )
        config = accelerate_config(plan)
        path = plan.add(
            "accelerate_config.yaml",
            yaml.safe_dump(config, sort_keys=True),
            "accelerate config the script is launched with",
        )
        args = [f"--pretrained_model_name_or_path={weights(plan)}", "--output_dir=output/autofit"]
        _data(script, args, plan)
        _encoders(plan, script, args)
        resolution = plan.value("resolution")
        args += [
            f"--resolution={resolution}",
            f"--train_batch_size={plan.value('batch_size')}",
            f"--gradient_accumulation_steps={point.accumulation}",
            f"--mixed_precision={config['mixed_precision']}",
        ]
        if script.kind != "controlnet":  # it resizes and center-crops to the square always
            args.insert(args.index(f"--resolution={resolution}") + 1, "--center_crop")
        if plan.value("checkpointing"):
            args.append("--gradient_checkpointing")
        if script.lora:
            args.append(f"--rank={rank}")
        _optimizer(plan, script, args)
        _extras(plan, script, args)
        command = " ".join(
            [launch_prefix(plan, str(path)), script.path, *(shlex.quote(a) for a in args)]
        )
        plan.add("launch.sh", "#!/bin/sh\n" + command, f"the launch command for {script.path}")
        plan.command = command
        plan.note("run the launch command from a clone of the diffusers repository")


TARGET = Diffusers()
