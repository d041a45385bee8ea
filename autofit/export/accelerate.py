"""`target=accelerate`: an accelerate config file (`accelerate_config.yaml`) for the user's own code.

The file says how to launch: processes, mixed precision, and, when the run uses ZeRO, the
DeepSpeed block accelerate builds its DeepSpeed plugin from. Everything else (batch, optimizer,
checkpointing, ...) is the training script's; the README lists what it must set. The diffusers
target launches its example scripts with the same file.
"""

from __future__ import annotations

from typing import Any

from autofit.export.base import Plan, Target, mixed_precision, script_settings
from autofit.export.deepspeed import GRADIENT_CLIPPING, zero_knobs


def accelerate_config(plan: Plan) -> dict[str, Any]:
    """The config as `accelerate config` would write it for this run."""
    world = plan.value("world_size")
    stage, offload_optimizer, offload_params = zero_knobs(plan)
    distributed = "DEEPSPEED" if stage else ("MULTI_GPU" if world > 1 else "NO")
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": distributed,
        "downcast_bf16": "no",
        "enable_cpu_affinity": False,
        "gpu_ids": "all",
        "machine_rank": 0,
        "main_training_function": "main",
        "mixed_precision": mixed_precision(plan),
        "num_machines": 1,
        "num_processes": world,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }
    if stage:
        config["deepspeed_config"] = {
            "gradient_accumulation_steps": plan.point.accumulation,
            "gradient_clipping": GRADIENT_CLIPPING,
            "offload_optimizer_device": offload_optimizer,
            "offload_param_device": offload_params,
            # ZeRO-3 builds the model already partitioned; otherwise each rank would first hold
            # all of it.
            "zero3_init_flag": stage == 3,
            "zero_stage": stage,
        }
        if stage == 3:
            config["deepspeed_config"]["zero3_save_16bit_model"] = True
    return config


def launch_prefix(plan: Plan, config_path: str) -> str:
    """`accelerate launch --config_file ...`, with the accumulation where the file cannot hold it."""
    accumulation = plan.point.accumulation
    env = ""
    if accumulation > 1 and not plan.point.config["zero_stage"]:
        # Without DeepSpeed the config file has no accumulation; Accelerator() reads this variable.
        env = f"ACCELERATE_GRADIENT_ACCUMULATION_STEPS={accumulation} "
    return f"{env}accelerate launch --config_file {config_path}"


class Accelerate(Target):
    name = "accelerate"
    summary = "an accelerate config (processes, mixed precision, DeepSpeed block for ZeRO) for your own code"

    def build(self, plan: Plan) -> None:
        import yaml

        config = accelerate_config(plan)
        path = plan.add(
            "accelerate_config.yaml",
            yaml.safe_dump(config, sort_keys=True),
            "accelerate config: accelerate launch --config_file <it> your_script.py",
        )
        plan.command = f"{launch_prefix(plan, str(path))} train.py"
        plan.note("train.py stands for your training script, which uses accelerate's Accelerator")
        if plan.point.accumulation > 1 and not config.get("deepspeed_config"):
            plan.note(
                f"gradient accumulation: {plan.point.accumulation} steps (set by the launch "
                "command's ACCELERATE_GRADIENT_ACCUMULATION_STEPS; use accelerator.accumulate(model))"
            )
        if plan.point.config["offload_optimizer"] == "cpu":
            plan.note(
                "offload_optimizer=cpu: accelerate.prepare() swaps your torch AdamW for DeepSpeed's "
                "CPU Adam (ZeRO-Offload steps on the host)"
            )
        script_settings(
            plan,
            ["batch_size", "resolution", "optimizer", "checkpointing", "train_mode", "lora_rank",
             "encoders", "ema", "validation", "attention", "swap_blocks"],
        )  # fmt: skip


TARGET = Accelerate()
