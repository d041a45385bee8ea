"""`target=kohya`: an sd-scripts training TOML (`--config_file`) and dataset TOML (`dataset_config`).

Keys are sd-scripts' argument names (its config file holds them without the dashes); each knob's
kohya words (autofit/knobs/) give them, sd-scripts' rules included (its block-swap limits, fp8 at
most for a quantized base, no EMA). The trainer is the family's script in sd-scripts:
`flux_train.py` / `flux_train_network.py` (Chroma: `flux_train_network.py` with the family's
flags, `--model_type chroma`), `sd3_train.py` / `sd3_train_network.py`,
`sdxl_train.py` / `sdxl_train_network.py`, `train_db.py` / `train_network.py` (SD 1.x/2.x, with
`v2` and `v_parameterization` for 2.x), as each family declares it (autofit/families/);
sd-scripts has no Sana trainer and no SD3 ControlNet trainer. Below what the run measured,
train.toml holds sd-scripts' documented learning rate, epochs or steps and FLUX.1's timestep and
guidance flags for the family and mode (autofit/export/trainer_defaults.yaml), each marked as a
default to review.
"""

from __future__ import annotations

import shlex
from typing import Any

from autofit.export.base import ExportPlan, Target, steps_note
from autofit.export.defaults import MARK
from autofit.export.toml import dumps
from autofit.families import KohyaScripts, kohya
from autofit.trainers import DATA_DIR


def _files(plan: ExportPlan, scripts: KohyaScripts) -> dict[str, Any]:
    point = plan.point
    files = {"pretrained_model_name_or_path": f"path/to/{point.model}.safetensors"}
    for key, name in scripts.files.items():
        files[key] = f"path/to/{name}"
    plan.note(
        f"replace the 'path/to/...' placeholders of train.toml ({', '.join(files)}) with your files"
    )
    return files


def _dataset(batch_size: int, resolution: int) -> dict[str, Any]:
    return {
        "general": {"caption_extension": ".txt"},
        "datasets": [
            {
                # Buckets keep the area of resolution x resolution: no batch holds more
                # pixels than the measured one.
                "resolution": resolution,
                "batch_size": batch_size,
                "enable_bucket": True,
                "min_bucket_reso": max(256, resolution // 2),
                "max_bucket_reso": resolution * 2,
                "bucket_reso_steps": 64,
                "bucket_no_upscale": True,
                "subsets": [{"image_dir": DATA_DIR, "num_repeats": 1}],
            }
        ],
    }


class Kohya(Target):
    name = "kohya"
    summary = (
        "kohya sd-scripts' training TOML and dataset TOML (Flux, Chroma, SD3, SDXL, SD 1.x/2.x)"
    )

    def build(self, plan: ExportPlan) -> None:
        point = plan.point
        scripts = kohya(point.family)
        assert scripts is not None  # the family's check refused it otherwise
        args = _files(plan, scripts)
        dataset = plan.add(
            "dataset.toml",
            dumps(_dataset(plan.value("batch_size"), plan.value("resolution"))),
            "sd-scripts dataset config (dataset_config)",
        )
        args.update(
            dataset_config=str(dataset),
            output_dir="output",
            output_name=point.study,
            save_model_as="safetensors",
        )
        args.update(scripts.flags)  # the family's model type, before what the run says
        full = point.config["train_mode"] == "full"
        world = plan.value("world_size")  # the launcher's --num_processes
        if scripts.model_flags is not None:
            args.update(scripts.model_flags(point.preset.architecture, point.preset.inputs))
        if full:
            args.update(scripts.full_flags)
        args.update(plan.say_rest())  # train_mode's words refuse a full fine-tune it has not
        script = scripts.full if full else scripts.lora
        assert script is not None
        args["gradient_accumulation_steps"] = point.accumulation
        text = dumps(args)
        # A default the run already says, with the same value, stays where it is (a TOML key is
        # written once); below the run's keys the others are top-level keys too (no tables).
        defaults = {k: v for k, v in plan.training_defaults(args).items() if k not in args}
        if defaults:
            text += f"\n# {plan.defaults_heading}\n" + dumps(defaults, comment=MARK)
        config = plan.add("train.toml", text, f"sd-scripts training config for {script}")
        plan.note(f"put your images (with .txt captions) in '{DATA_DIR}' of dataset.toml")
        steps_note(
            plan,
            "an epoch is your images x num_repeats (1 in dataset.toml) / that many steps, for "
            "max_train_epochs (or until max_train_steps) of train.toml",
        )
        plan.note("run the launch command from sd-scripts' folder")
        plan.command = (
            f"accelerate launch --num_processes {world} --mixed_precision {args['mixed_precision']} "
            f"{script} --config_file {shlex.quote(str(config))}"
        )


TARGET = Kohya()
