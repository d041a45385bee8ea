"""`target=simpletuner`: SimpleTuner's `config.json` and `multidatabackend.json` (SimpleTuner 4.10).

Keys are the names of SimpleTuner's own argument parser (its config.json holds them without the
leading dashes); each knob's SimpleTuner words (autofit/knobs/) give them. The dataset is one
square bucket at the measured resolution (`crop_aspect: square`), so every batch has the shape the
probe measured, and a text-embed cache; an editing model's references (FLUX.1 Kontext, Qwen-Image-
Edit) are a conditioning dataset of the same layout, cropped as its targets are
(`reference_strict`), which the images' dataset names (`conditioning_data`). With ZeRO, the DeepSpeed config goes beside it.
config.json also holds SimpleTuner's documented learning rate, schedule and steps, and Flux's
guidance, for the family and mode (autofit/export/trainer_defaults.yaml): defaults to review,
which JSON cannot mark, so the printed note and README.txt list them.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from autofit.export.base import ExportPlan, Target, steps_note, weights
from autofit.export.deepspeed import ds_config_of
from autofit.families import simpletuner
from autofit.trainers import DATA_DIR, SIMPLETUNER_ENV

# placeholder: the reference images, one per image of DATA_DIR with its file name
REFERENCE_DIR = "path/to/reference_images"


def _model(plan: ExportPlan) -> dict[str, Any]:
    point = plan.point
    model = simpletuner(point.family)
    assert model is not None  # the family's check refused it otherwise
    config: dict[str, Any] = {"model_family": model.model_family}
    # The preset's own names: its model_flavour (SimpleTuner then knows the weights) and what
    # SimpleTuner requires of that flavour.
    config.update(point.preset.trainers.get("simpletuner", {}))
    if "model_flavour" not in config:
        config["pretrained_model_name_or_path"] = weights(plan)
    if model.controlnet:
        config["controlnet"] = True
    return config


def _images(name: str, folder: str, resolution: int, captions: bool) -> dict[str, Any]:
    return {
        "id": name,
        "type": "local",
        "instance_data_dir": folder,
        **({"caption_strategy": "textfile"} if captions else {}),
        # One square bucket at the measured size: every batch has the measured shape.
        "crop": True,
        "crop_style": "center",
        "crop_aspect": "square",
        "resolution": resolution,
        "resolution_type": "pixel_area",
        "minimum_image_size": resolution,
        "cache_dir_vae": f"cache/vae/{{model_family}}/{name}",
    }


def _databackend(resolution: int, references: bool) -> list[dict[str, Any]]:
    images = _images(f"autofit-{resolution}", DATA_DIR, resolution, captions=True)
    backends = [images]
    if references:
        # The edit quickstarts' layout (documentation/quickstart/FLUX_KONTEXT.md, QWEN_EDIT.md at
        # bc8e6ab7): the references' own dataset, its latents cached, paired by file name and
        # cropped as the targets are.
        name = f"autofit-{resolution}-reference"
        images["conditioning_data"] = [name]
        backends.append(
            {
                **_images(name, REFERENCE_DIR, resolution, captions=False),
                "dataset_type": "conditioning",
                "conditioning_type": "reference_strict",
            }
        )
    return [
        *backends,
        {
            "id": "text-embeds",
            "dataset_type": "text_embeds",
            "default": True,
            "type": "local",
            "cache_dir": "cache/text/{model_family}",
        },
    ]


class SimpleTuner(Target):
    name = "simpletuner"
    summary = "SimpleTuner's config.json and multidatabackend.json (copy them to config/autofit/)"

    def build(self, plan: ExportPlan) -> None:
        point = plan.point
        config = {**_model(plan), **plan.say_rest()}
        if point.config["zero_stage"]:
            plan.add("ds_config.json", json.dumps(ds_config_of(plan), indent=2), "DeepSpeed config")
        config.update(
            data_backend_config=f"config/{SIMPLETUNER_ENV}/multidatabackend.json",
            output_dir=f"output/{SIMPLETUNER_ENV}",
        )
        config.update(plan.training_defaults(config, unmarked_in="config.json"))
        resolution = point.config["resolution"]
        plan.add(
            "config.json",
            json.dumps(dict(sorted(config.items())), indent=2),
            "SimpleTuner training config",
        )
        references = bool(point.preset.inputs.get("num_reference_images"))
        plan.add(
            "multidatabackend.json",
            json.dumps(_databackend(resolution, references), indent=2),
            f"SimpleTuner dataset: one square {resolution}px bucket and the text-embed cache",
        )
        plan.note(f"put your images (with .txt captions) in '{DATA_DIR}' of multidatabackend.json")
        if references:
            plan.note(
                f"put each image's reference image, of the same file name, in '{REFERENCE_DIR}' "
                "of multidatabackend.json"
            )
        steps_note(
            plan,
            "an epoch is your images (times a dataset's repeats) / that many steps, and training "
            "runs max_train_steps of config.json (num_train_epochs 0: steps decide)",
        )
        plan.command = (
            f"mkdir -p config/{SIMPLETUNER_ENV} && cp {shlex.quote(str(plan.out))}/*.json config/{SIMPLETUNER_ENV}/ && "
            f"TRAINING_NUM_PROCESSES={point.world_size} "
            f"MIXED_PRECISION={config['mixed_precision']} simpletuner train --env {SIMPLETUNER_ENV}"
        )
        plan.note("run the launch command from SimpleTuner's working directory")


TARGET = SimpleTuner()
