"""`target=onetrainer`: a OneTrainer training config and its concepts file (Nerogar/OneTrainer at
23df3832, 2026-08-19).

OneTrainer is not on PyPI: it runs from its folder as `python scripts/train.py --config-path
config.json`, which reads the file into `TrainConfig.default_values()` with `from_dict`
(modules/util/config/TrainConfig.py), running the file's migrations from its `__version` on. The
file says `__version` 11, that commit's config version, so none runs: what is written is read as
written. Its keys are TrainConfig's, with the sub-configs of the model's parts (`transformer` or
`unet`, `text_encoder`, `text_encoder_2`, `vae`: ModelType.model_parts), `optimizer` and
`quantization`; each knob's onetrainer words (autofit/knobs/) give a sub-config's key as
`part.key`. The layout writes the model type and weights, the companions' parts (not trained, in
the dtype autofit ran them in), the micro-batch, the accumulation, the resolution, the output
format, and the concepts file: one concept whose folder is a placeholder. Below them,
OneTrainer's preset learning rate, epochs and timestep flags for the family
(autofit/export/trainer_defaults.yaml), defaults to review, listed in README.txt (JSON holds no
comment).

Option names and values are those of 23df3832's config classes and enums:
tests/test_export_onetrainer.py loads the exported files with OneTrainer's own TrainConfig and
ConceptConfig at that commit and checks that every value written is what they hold; where no clone
is, it checks every key and enum name against the names captured from that source in
tests/fixtures/export/onetrainer_23df3832.json.
"""

from __future__ import annotations

import copy
import json
import shlex
from typing import Any

from autofit.export.accelerate import allocator_env
from autofit.export.base import ExportPlan, Target, steps_note, weights
from autofit.families import OneTrainerModel, onetrainer

IMAGE_DIR = "path/to/images"  # placeholder: autofit never sees the user's data
CONFIG_VERSION = 11  # TrainConfig's config_version at 23df3832: no migration runs on the file
CONCEPT_VERSION = 2  # ConceptConfig's
# What OneTrainer's companions are stored in, by the dtype autofit runs them in.
DATA_TYPES = {"fp32": "FLOAT_32", "fp16": "FLOAT_16", "bf16": "BFLOAT_16"}
# Where each training method writes its result, in a format every one of these models supports
# (ModelType.supported_output_formats).
OUTPUTS = {
    "LORA": {"output_model_format": "DIFFUSERS_LORA", "output_model_destination": "models/lora.safetensors"},
    "FINE_TUNE": {"output_model_format": "DIFFUSERS", "output_model_destination": "models/model"},
}  # fmt: skip


def nested(settings: dict[str, Any]) -> dict[str, Any]:
    """`part.key` settings as TrainConfig's sub-configs; the others as they are."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        part, dot, field = key.partition(".")
        if dot:
            out.setdefault(part, {})[field] = copy.deepcopy(value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _model(plan: ExportPlan, model: OneTrainerModel) -> dict[str, Any]:
    preset = plan.point.preset
    settings: dict[str, Any] = {
        "__version": CONFIG_VERSION,
        "model_type": model.model_type_for(preset.architecture, preset.inputs),
        "base_model_name": weights(plan),
        f"{model.denoiser}.train": True,
    }
    # The companions are OneTrainer's parts of the same names: frozen (its text encoders train
    # unless told not to), stored in the dtype autofit ran them in (its default is fp32).
    for part, spec in preset.companions.items():
        if part.startswith("text_encoder"):
            settings[f"{part}.train"] = False
        settings[f"{part}.weight_dtype"] = DATA_TYPES[spec.get("dtype", "bf16")]
    return settings


def _concepts() -> str:
    concept = {
        "__version": CONCEPT_VERSION,
        "name": "images",
        "path": IMAGE_DIR,
        "enabled": True,
        "type": "STANDARD",
        # captions from a .txt file beside each image
        "text": {"prompt_source": "sample"},
    }
    return json.dumps([concept], indent=4)


class OneTrainer(Target):
    name = "onetrainer"
    summary = (
        "Nerogar OneTrainer's training config JSON and concepts file (Flux, Chroma, SDXL, "
        "SD 1.5/2.1; scripts/train.py)"
    )

    def build(self, plan: ExportPlan) -> None:
        point = plan.point
        model = onetrainer(point.family)
        assert model is not None  # the family's check refused it otherwise
        concepts = plan.add("concepts.json", _concepts(), "OneTrainer concepts: your image folder")
        settings = {
            **_model(plan, model),
            "concept_file_name": str(concepts),
            "resolution": str(plan.value("resolution") or point.preset.resolution),
            "batch_size": plan.value("batch_size"),
            "gradient_accumulation_steps": point.accumulation,
            **plan.say_rest(),
        }
        settings.update(OUTPUTS[settings["training_method"]])
        config = plan.out / "config.json"
        defaults = {
            key: value
            for key, value in plan.training_defaults(settings, unmarked_in="config.json").items()
            if key not in settings
        }
        plan.add(
            "config.json",
            json.dumps(nested({**settings, **defaults}), indent=4),
            "OneTrainer training config: model, parts, optimizer, LoRA, data settings",
        )
        plan.command = (
            f"{allocator_env(plan)}python scripts/train.py --config-path {shlex.quote(str(config))}"
        )
        plan.note(
            f"put your images (with .txt captions) in '{IMAGE_DIR}' of concepts.json (its path)"
        )
        plan.note(
            "OneTrainer buckets images by aspect at about resolution x resolution pixels "
            "(aspect_ratio_bucketing, its default); set it false to train the square crops "
            "autofit measured"
        )
        steps_note(
            plan,
            "an epoch is your images x the concept's balancing (its repeats) / that many steps, and training "
            "runs the epochs of config.json",
        )
        plan.note(
            "run the launch command from OneTrainer's folder in its Python environment, not "
            "through run-cmd.sh, whose lib.include.sh exports PYTORCH_CUDA_ALLOC_CONF="
            "garbage_collection_threshold:0.6,max_split_size_mb:128, an allocator setting "
            "autofit did not measure"
        )


TARGET = OneTrainer()
