"""Stable Diffusion XL: a UNet over 4-channel latents, with CLIP-L and CLIP-G."""

from __future__ import annotations

from autofit.families.base import (
    DIFFUSION_ATTENTION,
    MUSUBI_ONLY,
    AiToolkitModel,
    DiffusersScript,
    DiffusersScripts,
    Family,
    KohyaScripts,
    OneTrainerModel,
    SimpleTunerModel,
)
from autofit.words import Refuse

SDXL = Family(
    name="sdxl",
    workload="autofit.workloads.sdxl",
    libraries=(),
    loader="diffusers",
    unit="pixels",
    companions=("text_encoder", "text_encoder_2", "vae"),
    lora_sets={"attention": DIFFUSION_ATTENTION},
    trainers={
        "diffusers": DiffusersScripts(
            {
                "full": DiffusersScript("examples/text_to_image/train_text_to_image_sdxl.py", "text_to_image", False, ("cached",), ema=True),
                "lora": DiffusersScript("examples/text_to_image/train_text_to_image_lora_sdxl.py", "text_to_image", True, ("online",)),
            }
        ),
        # sd-scripts' SDXL scripts have no blocks_to_swap; without sdpa or xformers its UNet runs
        # its plain attention (the math path); its sampling (train_util.sample_images_common)
        # moves the VAE in before the denoising.
        "kohya": KohyaScripts(
            "sdxl_train.py", "sdxl_train_network.py", "networks.lora",
            always_fused_attention=False, sampling_moves_vae_first=True,
        ),
        "simpletuner": SimpleTunerModel("sdxl", lora_targets=DIFFUSION_ATTENTION),
        "sana": Refuse("Sana's train.py trains Sana models only"),
        "musubi": Refuse(MUSUBI_ONLY),
        # ai-toolkit 27a03a91: arch sdxl loads the UNet in the legacy StableDiffusion class
        # (toolkit/stable_diffusion_model.py), which quantizes no SDXL weight.
        "ai_toolkit": AiToolkitModel("sdxl", quantizes=False),
        # OneTrainer 23df3832: STABLE_DIFFUSION_XL_10_BASE, parts unet, text_encoder,
        # text_encoder_2, vae; its FLOAT_8 leaves the UNet's convolutions in 16 bits.
        "onetrainer": OneTrainerModel("STABLE_DIFFUSION_XL_10_BASE", denoiser="unet", fp8_matches=False),
    },
)  # fmt: skip
