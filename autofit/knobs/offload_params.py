"""offload_params: ZeRO-3's weight shares in host memory (`cpu`) or on the GPU (`none`)."""

from __future__ import annotations

from typing import Any

from autofit.knobs.base import Knob, Refuse, Say, Subject
from autofit.knobs.zero_stage import zero_rule


def _checked(value: Any, s: Subject) -> Say | Refuse:
    broken = zero_rule(s.config)
    return Refuse(broken) if broken else Say()  # zero_stage's block carries the device


def _kohya(value: Any, s: Subject) -> Say | Refuse:
    broken = zero_rule(s.config)
    if broken:
        return Refuse(broken)
    return Say(settings={"offload_param_device": value} if value != "none" else {})


class OffloadParams(Knob):
    name = "offload_params"
    default = "none"
    help = "ZeRO-3 weight shares in host memory: none | cpu"
    values = {
        "none": "the weight shares on the GPU",
        "cpu": "ZeRO-3's weight shares in host memory",
    }

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        return "none" if value == "cpu" else None

    trainers = {
        "accelerate": _checked,
        "deepspeed": _checked,
        "kohya": _kohya,
        "simpletuner": _checked,
        "diffusers": _checked,
        "sana": {
            "none": Say(),
            "cpu": Refuse("Sana's train.py shards with FSDP (train.use_fsdp), not DeepSpeed ZeRO"),
        },
    }
