"""`target=simpletuner`: SimpleTuner's `config.json` and `multidatabackend.json` (SimpleTuner 4.10).

Keys are the names of SimpleTuner's own argument parser (its config.json holds them without the
leading dashes). The dataset is one square bucket at the measured resolution (`crop_aspect:
square`), so every batch has the shape the probe measured, and a text-embed cache.

What SimpleTuner cannot run as measured:
- its `mixed_precision` is also the dtype the trained weights are kept in (mixed_precision=bf16
  trains bf16 weights), so precision=bf16_pure is `bf16` and fp32 is `no`; precision=bf16 or fp16
  (fp32 master weights under autocast) exists only through DeepSpeed, i.e. with zero_stage >= 1;
- block swap is `musubi_blocks_to_swap`, which SimpleTuner offers for Flux, not Sana, SD3 or SDXL.
"""

from __future__ import annotations

import json
from typing import Any

from autofit.export.base import DATA_DIR, Plan, Target, weights
from autofit.export.deepspeed import ds_config, zero_knobs

# SimpleTuner's --model_family for each autofit family, and --model_flavour for each preset.
FAMILIES = {"sana": "sana", "sd3": "sd3", "sd3_controlnet": "sd3", "flux": "flux", "sdxl": "sdxl"}
FLAVOURS = {
    "sana_1600m": "sana1.0-1.6b-1024",
    "sana_600m": "sana1.0-600m-1024",
    "sd35_medium": "medium",
    "sd35_large": "large",
    "flux_dev": "dev",
    "sdxl": "base-1.0",
}
# The optimizer under SimpleTuner's name, and the --optimizer_config that makes it the one the
# probe ran (torch's SGD has no momentum by default; optimi's Lion adds a Kahan-summation buffer;
# SDNQ's CAME quantizes its buffers unless told not to).
OPTIMIZERS = {
    "adamw": ("torch-adamw", "fused=true"),
    "adamw8bit": ("bnb-adamw8bit", None),
    "paged_adamw8bit": ("bnb-adamw8bit-paged", None),
    "adafactor": ("torch-adafactor", None),
    "came": ("sdnq-came", "use_quantized_buffers=false,use_stochastic_buffers=false"),
    "lion": ("optimi-lion", "kahan_sum=false"),
    "lion8bit": ("bnb-lion8bit", None),
    "adamw_bf16": ("adamw_bf16", None),
    "sgd": ("torch-sgd", "momentum=0.9"),
}
# Families whose SimpleTuner model implements musubi block swap (its field registry's list).
BLOCK_SWAP_FAMILIES = ("flux",)
# SimpleTuner reads a named environment from config/<env>/ under its working directory.
ENV = "autofit"


def _precision(plan: Plan) -> str:
    precision = plan.value("precision")
    if zero_knobs(plan)[0]:
        return precision  # bf16 or fp16: DeepSpeed's 16-bit model with fp32 master weights
    if precision == "bf16_pure":
        return "bf16"
    if precision == "fp32":
        return "no"
    plan.refuse(
        "precision",
        "SimpleTuner keeps the trained weights in its mixed_precision dtype (mixed_precision=bf16 "
        "trains bf16 weights: precision=bf16_pure); it has no fp32-master-weight mode without "
        "DeepSpeed; export a point with precision=bf16_pure, or use target=kohya or accelerate",
    )


def _model(plan: Plan, config: dict[str, Any]) -> None:
    point = plan.point
    config["model_family"] = FAMILIES[point.family]
    flavour = FLAVOURS.get(point.model)
    if flavour:
        config["model_flavour"] = flavour
    else:
        config["pretrained_model_name_or_path"] = weights(plan)
    if point.family == "sd3_controlnet":
        config["controlnet"] = True
    mode = plan.value("train_mode")
    config["model_type"] = "full" if mode == "full" else "lora"
    rank = plan.value("lora_rank")
    if mode != "full":
        config["lora_type"] = "standard"
        config["lora_rank"] = rank
    # QLoRA: the base's linear layers in bitsandbytes NF4, the rest in bf16, as measured.
    config["base_model_precision"] = "nf4-bnb" if mode == "qlora" else "no_change"
    if mode == "qlora":
        config["base_model_default_dtype"] = "bf16"


def _memory(plan: Plan, config: dict[str, Any]) -> None:
    swap = plan.value("swap_blocks")
    if swap:
        if plan.point.family not in BLOCK_SWAP_FAMILIES:
            plan.refuse(
                "swap_blocks",
                f"SimpleTuner's block swap (musubi_blocks_to_swap) exists for "
                f"{', '.join(BLOCK_SWAP_FAMILIES)}, not {plan.point.family}",
            )
        config["musubi_blocks_to_swap"] = swap
    ema = plan.value("ema")
    config["use_ema"] = ema != "off"
    if ema != "off":
        config["ema_device"] = "accelerator" if ema == "gpu" else "cpu"
    attention = plan.value("attention")
    # diffusers' processors call torch's scaled_dot_product_attention: the fused kernels.
    config["attention_mechanism"] = "diffusers" if attention == "sdpa" else "native-math"
    encoders = plan.value("encoders")
    # SimpleTuner caches latents and text embeddings before training unless told to encode
    # on demand, which keeps the VAE and text encoders on the GPU.
    config["vae_cache_ondemand"] = encoders == "online"
    config["text_cache_ondemand"] = encoders == "online"
    if plan.value("validation") == "on":
        resolution = plan.point.config["resolution"]
        config.update(
            validation_disable=False,
            validation_prompt="a photo",
            validation_resolution=f"{resolution}x{resolution}",
            validation_step_interval=100,
        )
        plan.note("validation_prompt is a placeholder: put a prompt of your own")
    else:
        config["validation_disable"] = True


def _databackend(plan: Plan) -> list[dict[str, Any]]:
    resolution = plan.point.config["resolution"]
    return [
        {
            "id": f"autofit-{resolution}",
            "type": "local",
            "instance_data_dir": DATA_DIR,
            "caption_strategy": "textfile",
            # One square bucket at the measured size: every batch has the measured shape.
            "crop": True,
            "crop_style": "center",
            "crop_aspect": "square",
            "resolution": resolution,
            "resolution_type": "pixel_area",
            "minimum_image_size": resolution,
            "cache_dir_vae": f"cache/vae/{{model_family}}/autofit-{resolution}",
        },
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
    families = FAMILIES

    def build(self, plan: Plan) -> None:
        point = plan.point
        config: dict[str, Any] = {}
        _model(plan, config)
        resolution = plan.value("resolution")
        config.update(
            train_batch_size=plan.value("batch_size"),
            gradient_accumulation_steps=point.accumulation,
            resolution=resolution,
            resolution_type="pixel_area",
            mixed_precision=_precision(plan),
            gradient_checkpointing=plan.value("checkpointing"),
            num_processes=plan.value("world_size"),
        )
        name, options = OPTIMIZERS[plan.value("optimizer")]
        config["optimizer"] = name
        if options:
            config["optimizer_config"] = options
        if zero_knobs(plan)[0]:
            plan.add("ds_config.json", json.dumps(ds_config(plan), indent=2), "DeepSpeed config")
            config["deepspeed_config"] = f"config/{ENV}/ds_config.json"
        _memory(plan, config)
        config.update(
            data_backend_config=f"config/{ENV}/multidatabackend.json",
            output_dir=f"output/{ENV}",
        )
        plan.add(
            "config.json",
            json.dumps(dict(sorted(config.items())), indent=2),
            "SimpleTuner training config",
        )
        plan.add(
            "multidatabackend.json",
            json.dumps(_databackend(plan), indent=2),
            f"SimpleTuner dataset: one square {resolution}px bucket and the text-embed cache",
        )
        plan.note(f"put your images (with .txt captions) in '{DATA_DIR}' of multidatabackend.json")
        plan.command = (
            f"mkdir -p config/{ENV} && cp {plan.out}/*.json config/{ENV}/ && "
            f"TRAINING_NUM_PROCESSES={point.world_size} "
            f"MIXED_PRECISION={config['mixed_precision']} simpletuner train --env {ENV}"
        )
        plan.note("run the launch command from SimpleTuner's working directory")


TARGET = SimpleTuner()
