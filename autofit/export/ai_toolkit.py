"""`target=ai_toolkit`: an ai-toolkit job YAML (ostris/ai-toolkit at 27a03a91, 2026-08-21).

ai-toolkit is not on PyPI: it runs from its folder as `python run.py config.yaml`. Its job file is
`job: extension` with one `sd_trainer` process under `config.process` (run.py, jobs/
ExtensionJob.py, extensions_built_in/sd_trainer/), whose sections its process reads into
toolkit/config_modules.py's classes: `network` (NetworkConfig: a LoRA, absent for a full
fine-tune), `save`, `datasets` (DatasetConfig), `train` (TrainConfig), `model` (ModelConfig:
`arch` picks the model class) and `sample`. Each knob's ai_toolkit words (autofit/knobs/) give
their keys as `section.key` (`dataset.key` for the one dataset); the layout writes the micro-batch,
the accumulation (`gradient_accumulation`: one optimizer step per `steps`), and one bucket at the
measured size, the family's `arch` and flags (autofit/families/) and the preset's own names.
Below them, ai-toolkit's documented learning rate, steps and noise schedule for the family
(autofit/export/trainer_defaults.yaml), marked as defaults to review.

Option names are those of 27a03a91's config classes: tests/test_export_ai_toolkit.py constructs
them from the exported files with ai-toolkit's own code at that commit and checks that every key
written is one they read; where no clone is, it checks the keys and the enumerated values (arch,
optimizer, qtype, dtype, schedule, network, process type) against the names captured from that
source in tests/fixtures/export/ai_toolkit_27a03a91.json.
"""

from __future__ import annotations

import copy
import shlex
from typing import Any

import yaml

from autofit.export.base import ExportPlan, Target, steps_note, weights
from autofit.families import AiToolkitModel, ai_toolkit

IMAGE_DIR = "path/to/images"  # placeholder: autofit never sees the user's data
SECTIONS = ("network", "save", "dataset", "train", "model", "sample")


def sections(settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`section.key` settings as the process's sections, in ai-toolkit's order."""
    out: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for dotted, value in settings.items():
        section, key = dotted.split(".", 1)
        assert section in out, f"ai_toolkit words name an unknown section: {dotted}"
        out[section][key] = copy.deepcopy(value)  # a knob's block is its declaration
    return out


def _model(plan: ExportPlan, model: AiToolkitModel) -> dict[str, Any]:
    preset = plan.point.preset
    settings: dict[str, Any] = {"model.name_or_path": weights(plan), "model.arch": model.arch}
    if model.model_flags is not None:
        settings.update(model.model_flags(preset.architecture, preset.inputs))
    settings.update(preset.trainers.get("ai_toolkit", {}))  # what the preset alone needs
    return settings


def _dataset(plan: ExportPlan) -> dict[str, Any]:
    return {
        "dataset.folder_path": IMAGE_DIR,
        "dataset.caption_ext": "txt",
        # One bucket size: ai-toolkit buckets each image at about this area (its aspect kept),
        # so no batch holds more pixels than the measured one.
        "dataset.resolution": [plan.value("resolution") or plan.point.preset.resolution],
    }


def _process(plan: ExportPlan, parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    # No `device`: the sd_trainer process trains on its Accelerator's device and never reads one
    # (jobs/process/BaseSDTrainProcess.py at 27a03a91), whatever ai-toolkit's examples write.
    process: dict[str, Any] = {"type": "sd_trainer", "training_folder": "output"}
    for name in SECTIONS:
        if name == "dataset":
            process["datasets"] = [parts["dataset"]]
        elif parts[name] or name == "train":
            process[name] = parts[name]
    return process


def _yaml(job: dict[str, Any]) -> str:
    return yaml.safe_dump(job, sort_keys=False, default_flow_style=None, width=100)


class AiToolkit(Target):
    name = "ai_toolkit"
    summary = "ostris ai-toolkit's job YAML (Flux, Chroma, SDXL, SD 1.x/2.x; run.py)"

    def build(self, plan: ExportPlan) -> None:
        point = plan.point
        model = ai_toolkit(point.family)
        assert model is not None  # the family's check refused it otherwise
        settings = {
            **_model(plan, model),
            **_dataset(plan),
            "train.batch_size": plan.value("batch_size"),
            "train.gradient_accumulation": point.accumulation,
            **plan.say_rest(),
        }
        plan.value("world_size")  # one process on one GPU: world_size's default, said here
        defaults = {
            key: value
            for key, value in plan.training_defaults(settings).items()
            if key not in settings
        }
        config = plan.out / "config.yaml"
        plan.command = f"python run.py {shlex.quote(str(config))}"
        # The defaults go into their sections (one process reads them; a second YAML document
        # would be a second job), listed in a comment above as the values to review.
        job = {
            "job": "extension",
            "config": {
                "name": point.study,
                "process": [_process(plan, sections({**settings, **defaults}))],
            },
            "meta": {"name": "[name]", "version": "1.0"},
        }
        what = f"{point.label} of autofit study {point.study} ({point.model}, {point.gpu})"
        text = f"# ai-toolkit job for {what}\n# Launch from ai-toolkit's folder: {plan.command}\n"
        if defaults:
            text += f"# {plan.defaults_heading}:\n#   {', '.join(defaults)}\n"
        text += _yaml(job)
        plan.add("config.yaml", text, "ai-toolkit job: model, dataset, network, train settings")
        plan.note(
            f"put your images (with .txt captions) in '{IMAGE_DIR}' of config.yaml "
            "(datasets[0].folder_path)"
        )
        steps_note(
            plan,
            "an epoch is your images / that many steps, and training runs train.steps of "
            "config.yaml (gradient_accumulation batches make one step)",
        )
        plan.note("run the launch command from ai-toolkit's folder")


TARGET = AiToolkit()
