"""world_size: GPUs per run. Memory figures are per GPU, throughput is the whole run's; ZeRO or
FSDP partitions across them (only the simulate backend models more than one)."""

from __future__ import annotations

from typing import Any

from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say


def _sana(value: Any, s: Subject) -> Say | Refuse:
    if value == 1:
        return Say()
    return Refuse(
        "autofit measured several GPUs only with ZeRO or FSDP2, which Sana's train.py has not "
        "(its use_fsdp is FSDP1)",
        offers="world_size=1",
    )


class WorldSize(Knob):
    name = "world_size"
    depends_on = ("fsdp", "zero_stage")
    default = 1
    help = "GPUs per run (ZeRO or FSDP partitions across them)"
    kind = int
    minimum = 1

    def means(self, value: Any, subject: Subject) -> str:
        return f"{value} GPU{'s' if value > 1 else ''} per run"

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value > 1 and context.backend in ("cpu", "cuda"):
            return f"world_size={value}: a probe runs one process, so only the simulate backend models {value} GPUs"
        sharded = context.knobs.get("zero_stage") or context.knobs.get("fsdp", "off") != "off"
        if value > 1 and not sharded:
            return f"world_size={value} without ZeRO or FSDP runs the same memory on each GPU as world_size=1: use zero_stage 1-3 or fsdp"
        return None

    # deepspeed and kohya launch it (--num_gpus, --num_processes): their layouts write it.
    trainers = {
        "accelerate": lambda v, s: say(num_processes=v),
        "simpletuner": lambda v, s: say(num_processes=v),
        "sana": _sana,
        "diffusers": lambda v, s: Say(),  # the accelerate config's num_processes
        "trl": lambda v, s: Say(),  # the accelerate config's num_processes
        "axolotl": lambda v, s: Say(),  # the launch line's --num-processes
        "torchtune": lambda v, s: Say(),  # the launch line's --nproc_per_node
        "litgpt": lambda v, s: say(devices=v),  # one node's devices; Fabric launches them
        "llamafactory": lambda v, s: Say(),  # the launch line's NPROC_PER_NODE
        # OneTrainer trains on several GPUs with its own gradient reduce (multi_gpu,
        # modules/util/multi_gpu_util.py at 23df3832), which autofit has not matched
        "onetrainer": lambda v, s: (
            say(multi_gpu=False)
            if v == 1
            else Refuse(
                "autofit has not matched OneTrainer's multi_gpu training (its own gradient reduce)"
            )
        ),
    }
