"""fsdp_offload: FSDP2's CPU offload (`CPUOffloadPolicy`, pinned by default): the parameter
shards, their gradients, the optimizer state and the optimizer step in host memory (`cpu`), or on
the GPU (`none`). Each block's shards cross the host link before every all-gather, its gradient
shards on their way back, and the step runs on the host CPU. It needs fsdp (autofit/knobs/fsdp/
applies it and writes it into each trainer's FSDP settings)."""

from __future__ import annotations

from typing import Any

from autofit.knobs.base import Knob, Refuse, Say, say
from autofit.knobs.fsdp import FSDP1_ONLY, NO_FSDP, ZERO_NOT_FSDP
from autofit.knobs.fsdp.shared import checked, checked_all


class FsdpOffload(Knob):
    name = "fsdp_offload"
    depends_on = (
        "base_precision",
        "ema",
        "fsdp",
        "fused_backward",
        "optimizer",
        "swap_blocks",
        "validation",
        "zero_stage",
    )
    default = "none"
    help = "FSDP2 CPU offload of parameter shards, gradients and optimizer step: none | cpu"
    values = {
        "none": "FSDP's shards, gradients and optimizer state on the GPU",
        "cpu": "FSDP2's CPUOffloadPolicy: the shards, their gradients and the optimizer state "
        "in pinned host memory, the optimizer step on the host",
    }

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        return "none" if value == "cpu" else None

    trainers = {
        # fsdp's block carries it (fsdp_offload_params).
        "accelerate": checked(lambda v, s: Say()),
        "diffusers": checked(lambda v, s: Say()),
        "simpletuner": checked(lambda v, s: say(fsdp_cpu_offload=True) if v == "cpu" else Say()),
        "sana": {"none": Say(), "cpu": FSDP1_ONLY},
        "deepspeed": {"none": Say(), "cpu": Refuse(ZERO_NOT_FSDP, "fsdp_offload=none")},
        "kohya": {"none": Say(), "cpu": Refuse(NO_FSDP, "fsdp_offload=none")},
        "trl": checked(lambda v, s: Say()),
        # fsdp's fsdp_config carries it (offload_params); fsdp refuses where axolotl's FSDP differs
        "axolotl": checked(lambda v, s: Say()),
        # torchtune's fsdp_cpu_offload: FSDP2's CPUOffloadPolicy() on every fully_shard call
        "torchtune": checked_all(lambda v, s: say(fsdp_cpu_offload=True) if v == "cpu" else Say()),
        # LitGPT's FSDPStrategy: cpu_offload=False (finetune/full.py)
        "litgpt": {
            "none": Say(),
            "cpu": Refuse("LitGPT's FSDPStrategy keeps the shards on the GPU"),
        },
        # the accelerate config it is launched with carries it (fsdp_offload_params)
        "llamafactory": checked(lambda v, s: Say()),
    }
