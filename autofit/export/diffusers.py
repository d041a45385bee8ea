"""`target=diffusers`: the argument line for the matching diffusers example training script.

The script is the family's example in the diffusers repository (examples/...; each family
declares its scripts, autofit/families/), launched with `accelerate launch` and the accelerate
config this target writes beside it (processes, mixed precision, DeepSpeed for ZeRO). Each
knob's diffusers words (autofit/knobs/) give its arguments; `launch.sh` holds the whole command.
The arguments end with the example's documented learning rate, schedule and steps (and Flux's
guidance) for the family and mode (autofit/export/trainer_defaults.yaml), which a comment in
`launch.sh` marks as defaults to review.
"""

from __future__ import annotations

import shlex
from typing import Any

import yaml

from autofit.export.accelerate import accelerate_config, launch_prefix
from autofit.export.base import ExportPlan, Target, steps_note, weights
from autofit.families import diffusers_script
from autofit.trainers import DATA_DIR


def _argument(flag: str, value: Any) -> str:
    return flag if value is True else f"{flag}={value}"


class Diffusers(Target):
    name = "diffusers"
    summary = (
        "the argument line for the matching diffusers example script, with an accelerate config"
    )

    def build(self, plan: ExportPlan) -> None:

        point = plan.point
        plan.say("train_mode")  # which script trains it, if any does: first, it decides the rest
        script = diffusers_script(point.family, point.config["train_mode"])
        assert script is not None  # train_mode's words refused it otherwise
        settings = plan.say_rest()
        path = plan.add(
            "accelerate_config.yaml",
            yaml.safe_dump(accelerate_config(plan.settings_in("accelerate")), sort_keys=True),
            "accelerate config the script is launched with",
        )
        args = [f"--pretrained_model_name_or_path={weights(plan)}", "--output_dir=output/autofit"]
        if script.kind == "text_to_image":
            args += [f"--train_data_dir={DATA_DIR}", "--caption_column=text"]
        elif script.kind == "controlnet":
            args += [
                f"--train_data_dir={DATA_DIR}",
                "--conditioning_image_column=conditioning_image",
            ]
        if script.kind != "dreambooth":
            plan.note(f"'{DATA_DIR}' is an imagefolder dataset with the script's columns")
        args += [_argument(flag, value) for flag, value in settings.items()]
        # what the script must be told to train the preset as measured (its text length)
        args += [
            f"--{key}={value}" for key, value in point.preset.trainers.get(self.name, {}).items()
        ]
        defaults = [
            _argument(flag, value) for flag, value in plan.training_defaults(settings).items()
        ]
        args += defaults
        command = " ".join(
            [
                launch_prefix(plan, str(path)),
                shlex.quote(script.path),
                *(shlex.quote(a) for a in args),
            ]
        )
        heading = f"# {plan.defaults_heading}:\n#   {' '.join(defaults)}\n" if defaults else ""
        plan.add(
            "launch.sh", f"#!/bin/sh\n{heading}{command}", f"the launch command for {script.path}"
        )
        plan.command = command
        steps_note(
            plan,
            "an epoch is your images / that many steps, and the script runs --max_train_steps "
            "(or --num_train_epochs when no step count is given)",
        )
        plan.note("run the launch command from a clone of the diffusers repository")


TARGET = Diffusers()
