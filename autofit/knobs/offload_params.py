"""offload_params: ZeRO-3's weight shares in host memory (`cpu`), on an NVMe drive read through
pinned host buffers (`nvme`, ZeRO-Infinity), or on the GPU (`none`) (autofit/knobs/zero_stage.py
applies it, and writes the device into DeepSpeed's block)."""

from __future__ import annotations

from typing import Any

from autofit.knobs.base import Knob, Say, say
from autofit.knobs.offload_optimizer import kohya_nvme_path, nvme_saves_over
from autofit.knobs.zero_stage import LITGPT_NO_ZERO, NO_DEEPSPEED, TORCHTUNE_NO_ZERO, zero_checked


class OffloadParams(Knob):
    name = "offload_params"
    depends_on = ("offload_optimizer", "precision", "zero_stage")
    default = "none"
    help = "ZeRO-3 weight shares in host memory or on NVMe: none | cpu | nvme"
    values = {
        "none": "the weight shares on the GPU",
        "cpu": "ZeRO-3's weight shares in host memory",
        "nvme": "ZeRO-Infinity: ZeRO-3's weight shares on an NVMe drive, read through pinned "
        "host buffers",
    }

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        return nvme_saves_over(value, searched)

    trainers = {
        "accelerate": zero_checked(),
        "deepspeed": zero_checked(),
        "kohya": zero_checked(
            lambda v, s: (
                say(offload_param_device=v, **kohya_nvme_path("offload_param", v))
                if v != "none"
                else Say()
            )
        ),
        "simpletuner": zero_checked(),
        "diffusers": zero_checked(),
        "sana": {"none": Say(), "cpu": NO_DEEPSPEED, "nvme": NO_DEEPSPEED},
        "trl": zero_checked(),  # in the accelerate config it is launched with
        "axolotl": zero_checked(),  # in the DeepSpeed JSON its config names
        "torchtune": {"none": Say(), "cpu": TORCHTUNE_NO_ZERO, "nvme": TORCHTUNE_NO_ZERO},
        "litgpt": {"none": Say(), "cpu": LITGPT_NO_ZERO, "nvme": LITGPT_NO_ZERO},
        "llamafactory": zero_checked(),  # in the DeepSpeed JSON its config names
    }
