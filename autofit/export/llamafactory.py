"""`target=llamafactory`: a LLaMA-Factory training config (`config.yaml`, LLaMA-Factory 0.9.5),
with the DeepSpeed JSON it names where the run shards with ZeRO.

`llamafactory-cli train config.yaml` reads one flat YAML into its argument dataclasses
(llamafactory/hparams/: ModelArguments, DataArguments, transformers' Seq2SeqTrainingArguments,
FinetuningArguments) and runs supervised fine-tuning (`stage: sft`) with the Hugging Face Trainer.
Each knob's llamafactory words give its keys (autofit/knobs/): the batch and accumulation,
cutoff_len, finetuning_type with LoRA's rank, alpha and targets or freeze tuning's last layers, the
4-bit base (quantization_bit, NF4, double quantization), bf16/fp16/pure_bf16, transformers'
optimizer name, gradient checkpointing (on unless disabled; non-reentrant said outright),
flash_attn and Liger's kernels for the fused loss. Under ZeRO the `deepspeed` key names
`ds_config.json` beside it, the JSON target=deepspeed writes; DeepSpeed and more than one GPU
launch through torchrun (FORCE_TORCHRUN). Under FSDP the run is launched as LLaMA-Factory documents
it (examples/accelerate/fsdp2_config.yaml): `accelerate launch` with `accelerate_config.yaml`
beside it (processes, mixed precision, the FSDP block: the knobs' accelerate words) runs its
training entry point, `llamafactory.launcher`, on the YAML. The hyperparameters LLaMA-Factory's examples document
for the mode follow, marked as defaults to review.

Checked against LLaMA-Factory 0.9.5: its own get_train_args reads the exported configs in
tests/test_export_llamafactory.py, and its patch_config, patch_model and init_adapter set up a
model of the preset's config.json on the meta device (with transformers 5.6.0 and its other pins,
in an environment of their own: tests/llamafactory_env.py), with accelerate 1.11.0's own parser
reading the accelerate config into the FSDP plugin the Trainer gets.
"""

from __future__ import annotations

import shlex

import yaml

from autofit.export.accelerate import accelerate_config, allocator_env
from autofit.export.base import ExportPlan, Target, steps_note, weights
from autofit.export.deepspeed import add_ds_config, trainer_ds_config

# Placeholders: autofit never sees the user's data. LLaMA-Factory reads a dataset by its name in
# dataset_dir/dataset_info.json (data/parser.py).
DATASET = "your_dataset"
DATASET_DIR = "data"
OUTPUT_DIR = "output/autofit"
# The knobs whose accelerate words make an FSDP launch's config: processes, mixed precision, FSDP.
FSDP_LAUNCH = ["world_size", "precision", "fsdp", "fsdp_offload", "fsdp_version"]
# DeepSpeed's optimizer settings transformers fills from the Trainer's own arguments
# (integrations/deepspeed.py trainer_config_process): a written value that differs from them is a
# mismatch the Trainer refuses when it starts.
FILLED_BY_THE_TRAINER = {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}


def _ds_config(plan: ExportPlan) -> dict:
    """target=deepspeed's JSON for a trainer that builds its own optimizer, where ZeRO-Offload has
    DeepSpeed build its CPU Adam from the Trainer's learning rate and decay."""
    config = trainer_ds_config(plan)
    if "optimizer" in config:
        config["optimizer"] = {**config["optimizer"], "params": dict(FILLED_BY_THE_TRAINER)}
    return config


class LlamaFactory(Target):
    name = "llamafactory"
    summary = (
        "a LLaMA-Factory config.yaml for llamafactory-cli train (finetuning type, quantized base, "
        "batch, precision, optimizer, ZeRO JSON or FSDP accelerate config)"
    )

    def build(self, plan: ExportPlan) -> None:
        point = plan.point
        world = plan.value("world_size")
        settings = {
            "model_name_or_path": weights(plan),
            "stage": "sft",
            "do_train": True,
            "dataset": DATASET,
            "dataset_dir": DATASET_DIR,
            "output_dir": OUTPUT_DIR,
            **plan.say_rest(),
        }
        if point.config["zero_stage"]:
            settings["deepspeed"] = add_ds_config(plan, _ds_config(plan), "LLaMA-Factory")
        defaults = plan.training_defaults(settings)
        config = shlex.quote(str(plan.out / "config.yaml"))
        if point.config["fsdp"] != "off":
            accelerate = plan.add(
                "accelerate_config.yaml",
                yaml.safe_dump(accelerate_config(plan.settings_in("accelerate", FSDP_LAUNCH))),
                "accelerate config LLaMA-Factory is launched with (processes, mixed precision, FSDP)",
            )
            # The Trainer takes its FSDP plugin from what `accelerate launch` sets; launcher.py run
            # as a script trains on the YAML it is given, as llamafactory-cli's torchrun runs it.
            plan.command = (
                f"{allocator_env(plan)}accelerate launch --config_file "
                f"{shlex.quote(str(accelerate))} -m llamafactory.launcher {config}"
            )
        else:
            # LLaMA-Factory refuses DeepSpeed unless torchrun launched it (hparams/parser.py), and
            # starts torchrun for FORCE_TORCHRUN with NPROC_PER_NODE processes (launcher.py).
            torchrun = world > 1 or point.config["zero_stage"]
            launch = f"FORCE_TORCHRUN=1 NPROC_PER_NODE={world} " if torchrun else ""
            plan.command = f"{allocator_env(plan)}{launch}llamafactory-cli train {config}"
        what = f"{point.label} of autofit study {point.study} ({point.model}, {point.gpu})"
        body = yaml.safe_dump(settings, sort_keys=False)
        if defaults:
            body += f"# {plan.defaults_heading}:\n" + yaml.safe_dump(defaults, sort_keys=False)
        plan.add(
            "config.yaml",
            f"# LLaMA-Factory config for {what}\n# Launch: {plan.command}\n" + body,
            "LLaMA-Factory's config: model, dataset, fine-tuning method, batch, precision and "
            "memory settings",
        )
        plan.note(
            f"dataset '{DATASET}' in config.yaml: add your dataset to {DATASET_DIR}/"
            "dataset_info.json under that name (LLaMA-Factory's data/README.md gives the formats), "
            "and set `template` to your model's chat template (llama3, qwen, ...; without one "
            "LLaMA-Factory takes the tokenizer's own)"
        )
        steps_note(
            plan,
            "each example is cut to cutoff_len tokens and a batch padded to its longest, so the "
            "measured rows are the longest a step runs; an epoch is your examples / that many "
            "steps, for num_train_epochs or max_steps",
        )


TARGET = LlamaFactory()
