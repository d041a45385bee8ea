"""`target=deepspeed`: a DeepSpeed JSON config (`ds_config.json`) for the user's own training code.

The JSON carries the batch (micro-batch per GPU, gradient accumulation, their product over the
GPUs), the ZeRO stage and offload, and the precision block; the training code builds the model
and the optimizer (the README lists what it must build). The same config serves the trainers
that take a DeepSpeed JSON (SimpleTuner's `deepspeed_config`).
"""

from __future__ import annotations

import json
from typing import Any

from autofit.export.base import Plan, Target, script_settings

# DeepSpeed clips gradients at 1.0 unless told otherwise; written out so the file says it.
GRADIENT_CLIPPING = 1.0


def zero_knobs(plan: Plan) -> tuple[int, str, str]:
    """The ZeRO stage and offload devices, checked as autofit's ZeRO technique checks them: every
    target that expresses ZeRO reads them here."""
    stage = plan.value("zero_stage")
    offload_optimizer = plan.value("offload_optimizer")
    offload_params = plan.value("offload_params")
    if not stage and offload_optimizer != "none":
        plan.refuse("offload_optimizer", "offload needs zero_stage 1, 2 or 3")
    if offload_params != "none" and stage != 3:
        plan.refuse("offload_params", "weights are offloaded only by ZeRO stage 3")
    if stage and plan.point.config["precision"] not in ("bf16", "fp16"):
        plan.refuse(
            "precision",
            "ZeRO runs a 16-bit model with fp32 master weights (precision bf16 or fp16); "
            "autofit measured no other precision with zero_stage >= 1",
        )
    return stage, offload_optimizer, offload_params


def precision_block(plan: Plan) -> dict[str, Any]:
    """The precision entries, matching what the probe ran.

    With ZeRO the probe ran DeepSpeed's own mixed precision: a 16-bit model with fp32 master
    weights in the optimizer (`bf16` / `fp16` blocks). Without ZeRO it ran fp32 weights under
    torch autocast, which DeepSpeed writes as `torch_autocast` (with a GradScaler for fp16); a
    bf16_pure model is bf16 itself, so no block at all.
    """
    precision = plan.value("precision")
    if zero_knobs(plan)[0]:
        block: dict[str, Any] = {"enabled": True}
        if precision == "fp16":
            block["loss_scale"] = 0  # 0: dynamic loss scaling, as the probe's GradScaler
        return {precision: block}
    if precision in ("bf16", "fp16"):
        dtype = "bfloat16" if precision == "bf16" else "float16"
        return {"torch_autocast": {"enabled": True, "dtype": dtype}}
    if precision == "bf16_pure":
        plan.note(
            "precision=bf16_pure: create the model in bf16; the config has no precision block"
        )
    return {}


def zero_block(plan: Plan) -> dict[str, Any]:
    stage, offload_optimizer, offload_params = zero_knobs(plan)
    zero: dict[str, Any] = {"stage": stage}
    # Pinned host buffers change nothing on the GPU and speed up the copies.
    if offload_optimizer == "cpu":
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if offload_params == "cpu":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return zero


def optimizer_block(plan: Plan) -> dict[str, Any]:
    """An `optimizer` entry only where DeepSpeed must build the optimizer itself: ZeRO-Offload
    steps on the CPU with DeepSpeed's CPU Adam. Otherwise the training code passes its own."""
    if plan.point.config["offload_optimizer"] != "cpu":
        return {}
    optimizer = plan.value("optimizer")
    if optimizer != "adamw":
        plan.refuse(
            "optimizer",
            "ZeRO-Offload runs DeepSpeed's CPU AdamW; autofit measured offload only with optimizer=adamw",
        )
    return {"optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}}}


def ds_config(plan: Plan) -> dict[str, Any]:
    """The DeepSpeed JSON for the point, as a dict."""
    micro, world = plan.value("batch_size"), plan.value("world_size")
    accumulation = plan.point.accumulation
    config: dict[str, Any] = {
        "train_batch_size": micro * accumulation * world,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": GRADIENT_CLIPPING,
        **precision_block(plan),
        "zero_optimization": zero_block(plan),
        **optimizer_block(plan),
    }
    return config


class DeepSpeed(Target):
    name = "deepspeed"
    summary = "a DeepSpeed JSON (batch, accumulation, ZeRO stage and offload, precision) for your own code"

    def build(self, plan: Plan) -> None:
        config = ds_config(plan)
        path = plan.add(
            "ds_config.json",
            json.dumps(config, indent=2),
            "DeepSpeed config: pass it to deepspeed.initialize(config=...) or --deepspeed_config",
        )
        world = plan.point.world_size
        plan.command = (
            f"deepspeed --num_gpus {world} train.py --deepspeed --deepspeed_config {path}"
        )
        plan.note(
            "train.py stands for your training script: it calls deepspeed.initialize(model=..., "
            "optimizer=..., config=...) with this config"
        )
        knobs = ["resolution", "checkpointing", "train_mode", "lora_rank", "encoders", "ema",
                 "validation", "attention", "swap_blocks"]  # fmt: skip
        if "optimizer" in config:
            plan.note(
                "optimizer=adamw: DeepSpeed builds its CPU AdamW from the config (ZeRO-Offload); "
                "pass no optimizer of your own"
            )
        else:
            knobs.insert(0, "optimizer")
        script_settings(plan, knobs)


TARGET = DeepSpeed()
