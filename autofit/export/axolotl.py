"""`target=axolotl`: an axolotl config (`config.yaml`, axolotl 0.19), with the DeepSpeed JSON it
names where the run shards with ZeRO.

axolotl reads one flat YAML (its pydantic schema, axolotl/utils/schemas/) and launches the
Hugging Face Trainer itself through accelerate (`axolotl train config.yaml`). Each knob's axolotl
words give its keys (autofit/knobs/): the micro-batch and accumulation, sequence_len with the
padding that makes every row as long as the probe's, the adapter with its quantized base and its
LoRA rank, alpha and modules, bf16/fp16/bfloat16 and the adapters' dtype, the optimizer by
transformers' name, checkpointing and activation offload, the attention implementation, and Liger's
plugin for the fused loss. Under ZeRO the `deepspeed` key names `ds_config.json` beside it, the
JSON target=deepspeed writes; under FSDP `fsdp_version: 2` and `fsdp_config` say how axolotl's
own FSDP2 shards (the fsdp knob's axolotl words; its FSDP1 is refused). The hyperparameters axolotl's examples document for the mode follow,
marked as defaults to review.

Checked against axolotl 0.19.0: its own validate_config and normalize_config read the exported
configs in tests/test_export_axolotl.py (with transformers 5.16.1 and its other pins, in an
environment of their own: tests/axolotl_env.py), and transformers' TrainingArguments with
accelerate's FSDP plugin read the `fsdp_config` of an FSDP export into the plugin axolotl's Trainer
gets.
"""

from __future__ import annotations

import shlex

import yaml

from autofit.export.accelerate import allocator_env
from autofit.export.base import ExportPlan, Target, steps_note, weights
from autofit.export.deepspeed import add_ds_config, trainer_ds_config

DATASET = "path/to/dataset"  # placeholder: autofit never sees the user's data
OUTPUT_DIR = "output/autofit"


class Axolotl(Target):
    name = "axolotl"
    summary = "an axolotl config.yaml (adapter, quantized base, batch, precision, optimizer, ZeRO JSON, FSDP2)"

    def build(self, plan: ExportPlan) -> None:
        point = plan.point
        world = plan.value("world_size")
        settings = {
            "base_model": weights(plan),
            # raw text in a 'text' column; axolotl's chat_template type reads conversations
            "datasets": [{"path": DATASET, "type": "completion"}],
            "output_dir": OUTPUT_DIR,
            **plan.say_rest(),
        }
        if point.config["zero_stage"]:
            settings["deepspeed"] = add_ds_config(plan, trainer_ds_config(plan), "axolotl")
        defaults = plan.training_defaults(settings)
        config = plan.out / "config.yaml"
        launch = f" --launcher accelerate -- --num_processes {world}" if world > 1 else ""
        plan.command = f"{allocator_env(plan)}axolotl train {shlex.quote(str(config))}{launch}"
        what = f"{point.label} of autofit study {point.study} ({point.model}, {point.gpu})"
        body = yaml.safe_dump(settings, sort_keys=False)
        if defaults:
            body += f"# {plan.defaults_heading}:\n" + yaml.safe_dump(defaults, sort_keys=False)
        plan.add(
            "config.yaml",
            f"# axolotl config for {what}\n# Launch: {plan.command}\n" + body,
            "axolotl's config: model, dataset, adapter, batch, precision, optimizer and memory settings",
        )
        plan.note(
            f"'{DATASET}' in config.yaml: your dataset (a hub id or a local file) with a 'text' "
            "column, or change its type (chat_template for 'messages', alpaca, ...)"
        )
        steps_note(
            plan,
            "each example is one row of sequence_len tokens (padded; longer ones dropped unless "
            "excess_length_strategy says truncate), so an epoch is your examples / that many "
            "steps, for num_epochs or max_steps; on Hopper or newer GPUs sample_packing: true "
            "fills the same rows with packed examples",
        )


TARGET = Axolotl()
