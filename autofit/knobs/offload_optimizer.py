"""offload_optimizer: ZeRO-Offload, the optimizer state and update in host memory (`cpu`), or on
the GPU (`none`). It needs a ZeRO stage (autofit/knobs/zero_stage.py applies it)."""

from __future__ import annotations

from typing import Any

from autofit.knobs.base import Knob, Refuse, Say, Subject
from autofit.knobs.zero_stage import zero_rule


def _checked(note: str = "") -> Any:
    """ZeRO's block (written by zero_stage's words) carries the device; these check the rule."""

    def express(value: Any, s: Subject) -> Say | Refuse:
        broken = zero_rule(s.config)
        if broken:
            return Refuse(broken)
        return Say(note=note if value == "cpu" else "")

    return express


def _kohya(value: Any, s: Subject) -> Say | Refuse:
    broken = zero_rule(s.config)
    if broken:
        return Refuse(broken)
    return Say(settings={"offload_optimizer_device": value} if value != "none" else {})


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
        "accelerate": _checked(
            "offload_optimizer=cpu: accelerate.prepare() swaps your torch AdamW for DeepSpeed's "
            "CPU Adam (ZeRO-Offload steps on the host)"
        ),
        "deepspeed": _checked(),
        "kohya": _kohya,
        "simpletuner": _checked(),  # in the DeepSpeed config the export writes beside
        "diffusers": _checked(),  # in the accelerate config the script is launched with
        "sana": {
            "none": Say(),
            "cpu": Refuse("Sana's train.py shards with FSDP (train.use_fsdp), not DeepSpeed ZeRO"),
        },
    }
