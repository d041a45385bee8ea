"""Sana (NVlabs): a linear-attention DiT over DC-AE f32c32 latents, with Gemma-2 captions."""

from __future__ import annotations

from autofit.families.base import (
    DIFFUSION_ATTENTION,
    MUSUBI_ONLY,
    ONETRAINER_UNMATCHED,
    DiffusersScript,
    DiffusersScripts,
    Family,
    SanaScript,
    SimpleTunerModel,
)
from autofit.words import Refuse

SANA = Family(
    name="sana",
    workload="autofit.workloads.sana",
    libraries=(),
    loader="diffusers",
    unit="pixels",
    companions=("text_encoder", "vae"),
    lora_sets={"attention": DIFFUSION_ATTENTION},
    checkpoint_groups="blocks",
    denoiser_class="SanaTransformer2DModel",
    config_template="sana_1600m",
    trainers={
        "diffusers": DiffusersScripts(
            {"lora": DiffusersScript("examples/dreambooth/train_dreambooth_lora_sana.py", "dreambooth", True, ("cached", "online"))},
            lora_layers=True,
        ),
        "kohya": Refuse("sd-scripts has no Sana trainer"),
        "simpletuner": SimpleTunerModel("sana", lora_targets=DIFFUSION_ATTENTION),
        "sana": SanaScript("train_scripts/train.py"),
        "musubi": Refuse(MUSUBI_ONLY),
        "ai_toolkit": Refuse("ai-toolkit has no Sana model"),
        "onetrainer": Refuse(ONETRAINER_UNMATCHED.format(what="Sana (model_type SANA)")),
    },
)  # fmt: skip
