"""`target=accelerate`: an accelerate config file (`accelerate_config.yaml`) for the user's own code.

The file says how to launch: processes, mixed precision, and, when the run uses ZeRO, the
DeepSpeed block accelerate builds its DeepSpeed plugin from, or with FSDP2 the `fsdp_config`
block accelerate builds its FullyShardedDataParallelPlugin from (each knob's accelerate words).
Every other knob is the training script's; the export's README.txt lists what it must do. The
diffusers target launches its example scripts with the same file.
"""

from __future__ import annotations

import shlex
from typing import Any

import yaml

from autofit.export.base import ExportPlan, Target
from autofit.knobs.allocator import environment as allocator_environment

# What `accelerate config` writes for one machine, before the run's own settings.
MACHINE = {
    "compute_environment": "LOCAL_MACHINE",
    "debug": False,
    "downcast_bf16": "no",
    "enable_cpu_affinity": False,
    "gpu_ids": "all",
    "machine_rank": 0,
    "main_training_function": "main",
    "num_machines": 1,
    "rdzv_backend": "static",
    "same_network": True,
    "use_cpu": False,
}


def accelerate_config(settings: dict[str, Any]) -> dict[str, Any]:
    """The config as `accelerate config` would write it, with the knobs' accelerate settings."""
    return dict(sorted({**MACHINE, **settings}.items()))


def allocator_env(plan: ExportPlan) -> str:
    """The environment the allocator knob asks for, as a launch line's prefix ('' for none)."""
    allocator = plan.point.config.get("allocator", "default")
    return "".join(
        f"{key}={shlex.quote(str(value))} "
        for key, value in allocator_environment(allocator).items()
    )


def launch_prefix(plan: ExportPlan, config_path: str) -> str:
    """`accelerate launch --config_file ...`, with the accumulation where the file cannot hold it
    and the environment the allocator knob asks for."""
    accumulation = plan.point.accumulation
    env = allocator_env(plan)
    if accumulation > 1 and not plan.point.config["zero_stage"]:
        # Without DeepSpeed the config file has no accumulation; Accelerator() reads this variable.
        env += f"ACCELERATE_GRADIENT_ACCUMULATION_STEPS={accumulation} "
    return f"{env}accelerate launch --config_file {shlex.quote(config_path)}"


class Accelerate(Target):
    name = "accelerate"
    summary = "an accelerate config (processes, mixed precision, DeepSpeed block for ZeRO, FSDP2 block) for your own code"
    own_code = True

    def build(self, plan: ExportPlan) -> None:

        plan.note("train.py stands for your training script, which uses accelerate's Accelerator")
        # FSDP's distributed_type (FSDP) replaces the one zero_stage says without ZeRO (NO or
        # MULTI_GPU): fsdp's rules keep the two from both sharding.
        fsdp = plan.say("fsdp")
        config = accelerate_config({**plan.say_rest(), **fsdp})
        path = plan.add(
            "accelerate_config.yaml",
            yaml.safe_dump(config, sort_keys=True),
            "accelerate config: accelerate launch --config_file <it> your_script.py",
        )
        plan.command = f"{launch_prefix(plan, str(path))} train.py"
        if plan.point.accumulation > 1 and not config.get("deepspeed_config"):
            plan.note(
                f"gradient accumulation: {plan.point.accumulation} steps (set by the launch "
                "command's ACCELERATE_GRADIENT_ACCUMULATION_STEPS; use accelerator.accumulate(model))"
            )


TARGET = Accelerate()
