"""offload_optimizer: ZeRO-Offload, the optimizer state and update in host memory (`cpu`), or on
the GPU (`none`). It needs a ZeRO stage (autofit/knobs/zero_stage.py applies it, and writes the
device into DeepSpeed's `zero_optimization` block)."""

from __future__ import annotations

from typing import Any

from autofit.knobs.base import Knob, Say, say
from autofit.knobs.zero_stage import NO_DEEPSPEED, zero_checked

SWAPS_THE_OPTIMIZER = (
    "offload_optimizer=cpu: accelerate.prepare() swaps your torch AdamW for DeepSpeed's CPU Adam "
    "(ZeRO-Offload steps on the host)"
)


class OffloadOptimizer(Knob):
    name = "offload_optimizer"
    default = "none"
    help = "ZeRO-Offload: optimizer state and update in host memory: none | cpu"
    values = {
        "none": "the optimizer state and update on the GPU",
        "cpu": "ZeRO-Offload: the optimizer state and its update in host memory",
    }

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        return "none" if value == "cpu" else None

    trainers = {
        "accelerate": zero_checked(
            lambda v, s: Say(note=SWAPS_THE_OPTIMIZER if v == "cpu" else "")
        ),
        "deepspeed": zero_checked(),
        "kohya": zero_checked(
            lambda v, s: say(offload_optimizer_device=v) if v != "none" else Say()
        ),
        "simpletuner": zero_checked(),  # in the DeepSpeed config the export writes beside
        "diffusers": zero_checked(),  # in the accelerate config the script is launched with
        "sana": {"none": Say(), "cpu": NO_DEEPSPEED},
    }
