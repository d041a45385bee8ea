"""Supervised fine-tuning with TRL's SFTTrainer: best of autofit study llama3_2_1b-a40-offload (llama3_2_1b, a40).

Written by `autofit export target=trl`. sft.yaml beside it holds every setting (TRL's
ScriptArguments, SFTConfig and ModelConfig fields); a flag after --config overrides one:

    accelerate launch --config_file /WORKDIR/results/llama3_2_1b-a40-offload/export/trl/llama_qlora_zero3_nvme/accelerate_config.yaml /WORKDIR/results/llama3_2_1b-a40-offload/export/trl/llama_qlora_zero3_nvme/train.py --config /WORKDIR/results/llama3_2_1b-a40-offload/export/trl/llama_qlora_zero3_nvme/sft.yaml
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
    training_args.model_init_kwargs = {
        "dtype": model_args.dtype,
        "attn_implementation": model_args.attn_implementation,
        **(training_args.model_init_kwargs or {}),
    }

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
