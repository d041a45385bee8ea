"""`target=deepspeed`: a DeepSpeed JSON config (`ds_config.json`) for the user's own training code.

The JSON carries the batch (micro-batch per GPU, gradient accumulation, their product over the
GPUs), the precision block, the ZeRO stage and offload, and DeepSpeed's own optimizer where
ZeRO-Offload needs it: each knob's DeepSpeed words (autofit/knobs/). The training code builds the
model and the optimizer (the export's README.txt lists what it must build). The same config
serves the trainers that take a DeepSpeed JSON (SimpleTuner's `deepspeed_config`).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from autofit.export.base import ExportPlan, Target
from autofit.knobs.zero3_params import ZERO3_SETTINGS
from autofit.knobs.zero_stage import GRADIENT_CLIPPING

# The knobs whose DeepSpeed words make the JSON of a trainer that builds the model and optimizer
# itself (the Hugging Face Trainer axolotl runs): precision and ZeRO blocks; the optimizer's only
# where ZeRO-Offload has DeepSpeed build its CPU Adam.
SHARDING = (
    "precision",
    "zero_stage",
    "offload_optimizer",
    "offload_params",
    *(knob.name for knob in ZERO3_SETTINGS),
)


def ds_config(batch: dict[str, Any], rest: dict[str, Any]) -> dict[str, Any]:
    """The DeepSpeed JSON: the batch entries, the clipping DeepSpeed applies, then the rest."""
    return {**batch, "gradient_clipping": GRADIENT_CLIPPING, **rest}


def ds_config_of(plan: ExportPlan) -> dict[str, Any]:
    """The run's DeepSpeed JSON for another trainer's export (nothing recorded in its README)."""
    return ds_config(plan.settings_in("deepspeed", ["batch_size"]), plan.settings_in("deepspeed"))


def trainer_ds_config(plan: ExportPlan) -> dict[str, Any]:
    """The run's DeepSpeed JSON for a trainer that builds its own optimizer, unless ZeRO-Offload
    has DeepSpeed build it (nothing recorded in the export's README)."""
    knobs = [*SHARDING, *(["optimizer"] if plan.point.config["offload_optimizer"] == "cpu" else [])]
    return ds_config(
        plan.settings_in("deepspeed", ["batch_size"]), plan.settings_in("deepspeed", knobs)
    )


def add_ds_config(plan: ExportPlan, config: dict[str, Any], trainer: str) -> str:
    """`config` written as ds_config.json beside the trainer's own file, whose `deepspeed` key
    names it (axolotl, LLaMA-Factory): its path."""
    path = plan.add(
        "ds_config.json",
        json.dumps(config, indent=2),
        f"DeepSpeed config {trainer}'s `deepspeed` key names (ZeRO stage, offload, batch)",
    )
    return str(path)


class DeepSpeed(Target):
    name = "deepspeed"
    summary = "a DeepSpeed JSON (batch, accumulation, ZeRO stage and offload, precision) for your own code"
    own_code = True

    def build(self, plan: ExportPlan) -> None:
        world = plan.value("world_size")  # the launcher's --num_gpus (and the batch's product)
        plan.note(
            "train.py stands for your training script: it calls deepspeed.initialize(model=..., "
            "optimizer=..., config=...) with this config"
        )
        config = ds_config(plan.say("batch_size"), plan.say_rest())
        path = plan.add(
            "ds_config.json",
            json.dumps(config, indent=2),
            "DeepSpeed config: pass it to deepspeed.initialize(config=...) or --deepspeed_config",
        )
        plan.command = f"deepspeed --num_gpus {world} train.py --deepspeed --deepspeed_config {shlex.quote(str(path))}"


TARGET = DeepSpeed()
