"""An SD3 ControlNet trained against a frozen SD3 transformer (diffusers' ControlNet SD3 example)."""

from __future__ import annotations

from autofit.families.base import (
    COMPANION_LIBRARIES,
    MUSUBI_ONLY,
    DiffusersScript,
    DiffusersScripts,
    Family,
    SimpleTunerModel,
)
from autofit.words import Refuse

SD3_CONTROLNET = Family(
    name="sd3_controlnet",
    workload="autofit.workloads.sd3_controlnet",
    libraries=COMPANION_LIBRARIES,  # its text encoders and VAE stay resident
    loader="diffusers",
    unit="pixels",
    companions=("text_encoder", "text_encoder_2", "text_encoder_3", "vae"),
    trainers={
        "diffusers": DiffusersScripts(
            {"full": DiffusersScript("examples/controlnet/train_controlnet_sd3.py", "controlnet", False, ("mixed",))}
        ),
        "kohya": Refuse("sd-scripts has no SD3 ControlNet trainer"),
        "simpletuner": SimpleTunerModel("sd3", controlnet=True),
        "sana": Refuse("Sana's train.py trains Sana models only"),
        "musubi": Refuse(MUSUBI_ONLY),
        "ai_toolkit": Refuse("ai-toolkit trains no SD3 ControlNet"),
        "onetrainer": Refuse("OneTrainer trains no ControlNet"),
    },
)  # fmt: skip
