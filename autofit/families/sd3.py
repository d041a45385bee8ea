"""Stable Diffusion 3 and 3.5: an MMDiT over 16-channel latents, with CLIP-L, CLIP-G and T5-XXL."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autofit.families.base import (
    AI_TOOLKIT_UNMATCHED,
    DIFFUSION_ATTENTION,
    JOINT_ATTENTION,
    JOINT_BLOCK_LINEAR,
    MUSUBI_ONLY,
    ONETRAINER_UNMATCHED,
    DiffusersScript,
    DiffusersScripts,
    Family,
    KohyaScripts,
    SimpleTunerModel,
)
from autofit.words import Refuse


def kohya_blocks_to_swap(architecture: Mapping[str, Any]) -> int:
    """sd-scripts swaps at most the joint blocks less two."""
    return int(architecture["num_layers"]) - 2


SD3 = Family(
    name="sd3",
    workload="autofit.workloads.sd3",
    libraries=(),
    loader="diffusers",
    unit="pixels",
    companions=("text_encoder", "text_encoder_2", "text_encoder_3", "vae"),
    lora_sets={
        "attention": DIFFUSION_ATTENTION, "joint_attention": JOINT_ATTENTION,
        "all_linear": JOINT_BLOCK_LINEAR,
    },  # fmt: skip
    checkpoint_groups="segments",
    attention_modules=("attn", "attn2"),
    denoiser_class="SD3Transformer2DModel",
    config_template="sd35_medium",
    trainers={
        "diffusers": DiffusersScripts(
            {
                "full": DiffusersScript("examples/dreambooth/train_dreambooth_sd3.py", "dreambooth", False, ("online",)),
                "lora": DiffusersScript("examples/dreambooth/train_dreambooth_lora_sd3.py", "dreambooth", True, ("cached", "online")),
            },
            lora_layers=True,
        ),
        "kohya": KohyaScripts(
            "sd3_train.py", "sd3_train_network.py", "networks.lora_sd3",
            files={"clip_l": "clip_l.safetensors", "clip_g": "clip_g.safetensors", "t5xxl": "t5xxl_fp16.safetensors"},
            max_blocks_to_swap=kohya_blocks_to_swap,
        ),
        "simpletuner": SimpleTunerModel("sd3", lora_targets=DIFFUSION_ATTENTION),
        "sana": Refuse("Sana's train.py trains Sana models only"),
        "musubi": Refuse(MUSUBI_ONLY),
        "ai_toolkit": Refuse(AI_TOOLKIT_UNMATCHED.format(what="SD3 (arch sd3: quanto over every layer, where autofit measured SimpleTuner's exclusions; T5 quantized with it)")),
        "onetrainer": Refuse(ONETRAINER_UNMATCHED.format(what="SD3 (model_type STABLE_DIFFUSION_3, STABLE_DIFFUSION_35)")),
    },
)  # fmt: skip
