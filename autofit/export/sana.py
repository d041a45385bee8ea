"""`target=sana`: an overlay in the layout of NVlabs Sana's train configs (configs/sana_config/).

`sana_overlay.yaml` holds only what autofit decides (data, model, train sections, Sana's own key
names); it goes on top of the model's shipped config. Sana's train.py reads one config through
pyrallis, so the launch command passes the overlay as pyrallis' dotted flags
(`--train.train_batch_size=8`), which override the shipped config's values.

Sana's train.py trains the whole model under accelerate's mixed precision (fp32 weights), with
its optimizers registered through mmcv, and shards with FSDP rather than DeepSpeed.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from autofit.export.base import Plan, Target, knob_text

# The shipped train config each preset's architecture matches.
BASE_CONFIGS = {
    "sana_1600m": "configs/sana_config/1024ms/Sana_1600M_img1024.yaml",
    "sana_600m": "configs/sana_config/1024ms/Sana_600M_img1024.yaml",
}
# Sana's optimizer `type` (an mmcv registry name: torch.optim's classes and Sana's wrappers in
# diffusion/utils/optimizer.py) and the settings that make it the optimizer the probe ran.
OPTIMIZERS: dict[str, dict[str, Any]] = {
    "adamw": {"type": "AdamW", "lr": 1e-4, "weight_decay": 0.01, "fused": True},
    "adamw8bit": {"type": "AdamW8bitWrapper", "lr": 1e-4, "weight_decay": 0.01},
    "adafactor": {"type": "Adafactor", "lr": 1e-4, "weight_decay": 0.0},
    "came": {"type": "CAMEWrapper", "lr": 1e-4, "weight_decay": 0.01},
    "lion": {"type": "Lion", "lr": 1e-4, "weight_decay": 0.01},
    "sgd": {"type": "SGD", "lr": 1e-4, "momentum": 0.9},
}


def _refuse_unsupported(plan: Plan) -> None:
    if plan.value("train_mode") != "full":
        plan.refuse(
            "train_mode",
            "Sana's train.py trains the whole model; for LoRA use target=diffusers "
            "(train_dreambooth_lora_sana.py, which Sana's own train_lora.sh runs)",
        )
    plan.value("lora_rank")  # meaningless for full training
    for knob in ("zero_stage", "offload_optimizer", "offload_params"):
        if plan.value(knob) not in (0, "none"):
            plan.refuse(
                knob, "Sana's train.py shards with FSDP (train.use_fsdp), not DeepSpeed ZeRO"
            )
    if plan.value("world_size") > 1:
        plan.refuse(
            "world_size", "autofit measured several GPUs only with ZeRO, which Sana has not"
        )
    if plan.value("swap_blocks"):
        plan.refuse("swap_blocks", "Sana's train.py has no block swap")
    if plan.value("ema") != "off":
        plan.refuse("ema", "Sana's train config has no switch for an EMA copy of the weights")
    if plan.value("precision") == "bf16_pure":
        plan.refuse(
            "precision",
            "Sana's train.py keeps fp32 weights under accelerate's mixed precision "
            "(model.mixed_precision fp16, bf16 or fp32); it has no bf16-weight mode",
        )


def overlay(plan: Plan) -> dict[str, Any]:
    _refuse_unsupported(plan)
    resolution = plan.value("resolution")
    cached = plan.value("encoders") == "cached"
    optimizer = plan.value("optimizer")
    if optimizer not in OPTIMIZERS:
        plan.refuse(
            "optimizer",
            f"Sana's optimizer registry has no {optimizer}; it has "
            + ", ".join(f"{k} ({v['type']})" for k, v in OPTIMIZERS.items()),
        )
    if plan.value("attention") == "math":
        plan.warn(
            "attention",
            "Sana's attention runs its own kernels (linear self-attention, fused cross-attention), "
            "which hold less than the measured math path",
        )
    return {
        "data": {
            "image_size": resolution,
            # Precomputed DC-AE latents and Gemma features: no VAE or text encoder on the GPU.
            "load_vae_feat": cached,
            "load_text_feat": cached,
        },
        "model": {
            "image_size": resolution,
            "mixed_precision": plan.point.config["precision"],  # bf16_pure: _refuse_unsupported
            # One square size, as measured (multi-scale buckets hold about the same pixels).
            "multi_scale": False,
        },
        "train": {
            "train_batch_size": plan.value("batch_size"),
            "gradient_accumulation_steps": plan.point.accumulation,
            "grad_checkpointing": plan.value("checkpointing"),
            "optimizer": OPTIMIZERS[optimizer],
            "visualize": plan.value("validation") == "on",
        },
    }


def flags(data: dict[str, Any]) -> list[str]:
    """pyrallis' dotted flags for the overlay; a dict value is written as a YAML (JSON) string."""
    out = []
    for section, values in data.items():
        for key, value in values.items():
            text = (
                json.dumps(value, separators=(",", ":"))
                if isinstance(value, dict)
                else knob_text(value)
            )
            out.append(shlex.quote(f"--{section}.{key}={text}"))
    return out


class Sana(Target):
    name = "sana"
    summary = (
        "an overlay of NVlabs Sana's train config (configs/sana_config/), and its launch flags"
    )
    families = {"sana": "train_scripts/train.py"}

    def build(self, plan: Plan) -> None:
        import yaml

        data = overlay(plan)
        if data["data"]["load_vae_feat"]:
            plan.note(
                "encoders=cached: point data.data_dir at a dataset with precomputed DC-AE latents "
                "and text features (Sana's load_vae_feat / load_text_feat)"
            )
        if data["train"]["visualize"]:
            plan.note(
                "validation=on: train.visualize renders train.validation_prompts every eval_sampling_steps"
            )
        base = BASE_CONFIGS.get(plan.point.model)
        if base is None:
            base = "configs/sana_config/path/to/your_config.yaml"
            plan.note(
                f"autofit knows no shipped Sana config for {plan.point.model}: replace '{base}' "
                "with the config of the model you train"
            )
        plan.add(
            "sana_overlay.yaml",
            f"# On top of {base}\n" + yaml.safe_dump(data, sort_keys=False),
            f"overlay of {base} in Sana's config layout",
        )
        world = plan.point.world_size
        plan.command = " ".join(
            [f"torchrun --nproc_per_node={world} train_scripts/train.py",
             f"--config_path={base}", "--work_dir=output/autofit", *flags(data)]
        )  # fmt: skip
        plan.note("run the launch command from Sana's repository folder")


TARGET = Sana()
