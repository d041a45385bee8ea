"""offload_optimizer: ZeRO-Offload, the optimizer state and update in host memory (`cpu`), on an
NVMe drive through pinned host buffers (`nvme`, ZeRO-Infinity, stage 3), or on the GPU (`none`).
It needs a ZeRO stage (autofit/knobs/zero_stage.py applies it, and writes the device into
DeepSpeed's `zero_optimization` block; autofit/emulations/nvme.py emulates the drive)."""

from __future__ import annotations

from typing import Any

from autofit.knobs.base import Knob, Say, say
from autofit.knobs.zero_stage import (
    LITGPT_NO_ZERO,
    NO_DEEPSPEED,
    NVME_PATH,
    TORCHTUNE_NO_ZERO,
    zero_checked,
)

SWAPS_THE_OPTIMIZER = (
    "offload_optimizer=cpu: accelerate.prepare() swaps your torch AdamW for DeepSpeed's CPU Adam "
    "(ZeRO-Offload steps on the host)"
)


class OffloadOptimizer(Knob):
    name = "offload_optimizer"
    depends_on = ("offload_params", "precision", "zero_stage")
    default = "none"
    help = "ZeRO-Offload: optimizer state and update in host memory or on NVMe: none | cpu | nvme"
    values = {
        "none": "the optimizer state and update on the GPU",
        "cpu": "ZeRO-Offload: the optimizer state and its update in host memory",
        "nvme": "ZeRO-Infinity: the optimizer state on an NVMe drive, updated on the host through "
        "pinned buffers (zero_stage 3)",
    }

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        return nvme_saves_over(value, searched)

    trainers = {
        "accelerate": zero_checked(
            lambda v, s: Say(note=SWAPS_THE_OPTIMIZER if v == "cpu" else "")
        ),
        "deepspeed": zero_checked(),
        "kohya": zero_checked(
            lambda v, s: (
                say(offload_optimizer_device=v, **kohya_nvme_path("offload_optimizer", v))
                if v != "none"
                else Say()
            )
        ),
        "simpletuner": zero_checked(),  # in the DeepSpeed config the export writes beside
        "diffusers": zero_checked(),  # in the accelerate config the script is launched with
        "sana": {"none": Say(), "cpu": NO_DEEPSPEED, "nvme": NO_DEEPSPEED},
        # accelerate swaps the Trainer's AdamW for DeepSpeed's CPU Adam (the optimizer's words).
        "trl": zero_checked(),
        "axolotl": zero_checked(),  # in the DeepSpeed JSON its config names
        "torchtune": {"none": Say(), "cpu": TORCHTUNE_NO_ZERO, "nvme": TORCHTUNE_NO_ZERO},
        "litgpt": {"none": Say(), "cpu": LITGPT_NO_ZERO, "nvme": LITGPT_NO_ZERO},
        "llamafactory": zero_checked(),  # in the DeepSpeed JSON its config names
    }


def nvme_saves_over(value: Any, searched: tuple[Any, ...]) -> Any:
    """What an offload value saves memory over, at a speed cost: `cpu` over `none` (GPU
    memory); `nvme` over `cpu` (host memory, which the host budget holds to), or over `none`
    where the search does not try `cpu`."""
    if value == "cpu":
        return "none"
    if value == "nvme":
        return "cpu" if "cpu" in searched or not searched else "none"
    return None


def kohya_nvme_path(prefix: str, value: Any) -> dict[str, Any]:
    """sd-scripts' flag for the drive's directory (its deepspeed_utils arguments)."""
    return {f"{prefix}kohya_nvme_path": NVME_PATH} if value == "nvme" else {}
