"""`target=trl`: a TRL SFTTrainer run (TRL 1.16): `train.py`, its settings `sft.yaml`, and the
accelerate config it is launched with.

`sft.yaml` holds the fields of TRL's three argument dataclasses in one flat file, as TRL's own
`TrlParser` reads it (`python train.py --config sft.yaml`; a flag after it overrides a value):
`ScriptArguments` (the dataset), `ModelConfig` (how the model loads: its dtype and attention, the
4-bit base, the LoRA adapters) and `SFTConfig` (the HF Trainer's batch, accumulation, length,
mixed precision, optimizer, checkpointing, activation offload). Each knob's TRL words give its
fields (autofit/knobs/); the learning rate TRL documents for the mode follows, marked as a default
to review. `train.py` builds `BitsAndBytesConfig`, `LoraConfig` and `SFTConfig` from those fields
and trains with `SFTTrainer`. The accelerate config carries the processes and the sharding (ZeRO's
DeepSpeed block, FSDP's block) in the knobs' accelerate words, as for target=accelerate.
"""

from __future__ import annotations

import shlex

import yaml

from autofit.export.accelerate import accelerate_config, allocator_env
from autofit.export.base import ExportPlan, Target, steps_note, weights

DATASET = "path/to/dataset"  # placeholder: autofit never sees the user's data
OUTPUT_DIR = "output/autofit"
# The knobs whose accelerate words make the launch: processes, mixed precision, sharding.
LAUNCH = (
    "world_size",
    "precision",
    "zero_stage",
    "offload_optimizer",
    "offload_params",
    "fsdp",
    "fsdp_offload",
    "fsdp_version",
)

TRAIN_PY = '''"""Supervised fine-tuning with TRL's SFTTrainer: {what}.

Written by `autofit export target=trl`. sft.yaml beside it holds every setting (TRL's
ScriptArguments, SFTConfig and ModelConfig fields); a flag after --config overrides one:

    {command}
"""

from datasets import load_dataset
from peft import LoraConfig
from transformers import BitsAndBytesConfig
from trl import ModelConfig, ScriptArguments, SFTConfig, SFTTrainer, TrlParser


def main() -> None:
    script_args, training_args, model_args = TrlParser(
        (ScriptArguments, SFTConfig, ModelConfig)
    ).parse_args_and_config()
    training_args: SFTConfig
    # SFTTrainer loads the model by name with these (and places it: no device_map when sharded).
    training_args.model_init_kwargs = {{
        "dtype": model_args.dtype,
        "attn_implementation": model_args.attn_implementation,
        **(training_args.model_init_kwargs or {{}}),
    }}

    quantization = None
    if model_args.load_in_4bit:
        quantization = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=model_args.bnb_4bit_quant_type,
            bnb_4bit_use_double_quant=model_args.use_bnb_nested_quant,
            bnb_4bit_compute_dtype=model_args.dtype,
            bnb_4bit_quant_storage=model_args.bnb_4bit_quant_storage,
        )

    peft_config = None
    if model_args.use_peft:
        peft_config = LoraConfig(
            task_type=model_args.lora_task_type,
            r=model_args.lora_r,
            lora_alpha=model_args.lora_alpha,
            lora_dropout=model_args.lora_dropout,
            target_modules=model_args.lora_target_modules,
            use_dora=model_args.use_dora,
        )

    dataset = load_dataset(script_args.dataset_name, name=script_args.dataset_config)
    trainer = SFTTrainer(
        model=model_args.model_name_or_path,
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        quantization_config=quantization,
        peft_config=peft_config,
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)


if __name__ == "__main__":
    main()
'''


class Trl(Target):
    name = "trl"
    summary = (
        "a TRL SFTTrainer train.py with its sft.yaml (SFTConfig, ModelConfig) and accelerate config"
    )

    def build(self, plan: ExportPlan) -> None:
        point = plan.point
        settings = {
            "model_name_or_path": weights(plan),
            "dataset_name": DATASET,
            "output_dir": OUTPUT_DIR,
            **plan.say_rest(),
        }
        defaults = plan.training_defaults(settings)
        accelerate = plan.add(
            "accelerate_config.yaml",
            yaml.safe_dump(accelerate_config(plan.settings_in("accelerate", list(LAUNCH)))),
            "accelerate config train.py is launched with (processes, mixed precision, sharding)",
        )
        sft = plan.out / "sft.yaml"
        script = plan.out / "train.py"
        plan.command = (
            f"{allocator_env(plan)}accelerate launch --config_file {shlex.quote(str(accelerate))} "
            f"{shlex.quote(str(script))} --config {shlex.quote(str(sft))}"
        )
        what = f"{point.label} of autofit study {point.study} ({point.model}, {point.gpu})"
        body = yaml.safe_dump(settings, sort_keys=False)
        if defaults:
            body += f"# {plan.defaults_heading}:\n" + yaml.safe_dump(defaults, sort_keys=False)
        plan.add(
            "sft.yaml",
            f"# TRL SFT settings for {what}\n"
            "# Read by train.py through TrlParser (ScriptArguments, SFTConfig, ModelConfig).\n"
            + body,
            "TRL's settings: ScriptArguments, SFTConfig and ModelConfig fields",
        )
        plan.add(
            "train.py",
            TRAIN_PY.format(what=what, command=plan.command),
            "the training script: SFTTrainer with BitsAndBytesConfig and LoraConfig from sft.yaml",
        )
        plan.note(
            f"'{DATASET}' in sft.yaml: your dataset (a hub id or a folder load_dataset reads) with "
            "a 'text' column, or 'messages' in the chat format"
        )
        steps_note(
            plan,
            "an epoch is your examples / that many steps, for SFTConfig's num_train_epochs (3 "
            "unless set) or max_steps; each example is cut to max_length tokens, the length the "
            "run was measured at",
        )


TARGET = Trl()
