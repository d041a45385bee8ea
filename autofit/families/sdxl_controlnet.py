"""An SDXL ControlNet trained against a frozen SDXL UNet (diffusers' ControlNet SDXL example)."""

from __future__ import annotations

from autofit.families.base import (
    COMPANION_LIBRARIES,
    MUSUBI_ONLY,
    DiffusersScript,
    DiffusersScripts,
    Family,
)
from autofit.words import Refuse

SDXL_CONTROLNET = Family(
    name="sdxl_controlnet",
    workload="autofit.workloads.sdxl_controlnet",
    libraries=COMPANION_LIBRARIES,  # its text encoders and VAE stay resident
    loader="diffusers",
    unit="pixels",
    companions=("text_encoder", "text_encoder_2", "vae"),
    trainers={
        "diffusers": DiffusersScripts(
            {"full": DiffusersScript("examples/controlnet/train_controlnet_sdxl.py", "controlnet", False, ("mixed",))}
        ),
        "kohya": Refuse("autofit's kohya export writes sd-scripts' SDXL training scripts, not its ControlNet ones"),
        "simpletuner": Refuse(
            "autofit measures diffusers' train_controlnet_sdxl.py, whose text encoders and fp32 VAE "
            "stay on the GPU; SimpleTuner's SDXL ControlNet training unloads them and is not modelled"
        ),
        "sana": Refuse("Sana's train.py trains Sana models only"),
        "musubi": Refuse(MUSUBI_ONLY),
        "ai_toolkit": Refuse("ai-toolkit trains no SDXL ControlNet (its control_net adapter trains a ControlNet beside a LoRA, another run)"),
        "onetrainer": Refuse("OneTrainer trains no ControlNet"),
    },
)  # fmt: skip
