"""Stable Diffusion 1.x and 2.x: a UNet over 4-channel latents with one CLIP text encoder.

A family of its own, not SDXL's: the UNet and its training step are SDXL's without the pooled
embedding and size-and-crop conditioning (the workloads share autofit/workloads/unet.py), but
every trainer trains it with other scripts and names, and its 2.x presets need flags of their
own. diffusers' text_to_image examples (train_text_to_image.py, train_text_to_image_lora.py)
and sd-scripts' train_db.py / train_network.py train 1.x and 2.x alike, reading the prediction
type from the model (diffusers: its scheduler config; sd-scripts: --v2 --v_parameterization);
SimpleTuner trains 1.x as model_family sd1x, and 2.x as sd2x only where that name is registered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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

# sd-scripts' SD 2.x UNet: 1024-wide cross-attention for OpenCLIP ViT-H (library/model_util.py
# V2_UNET_PARAMS_CONTEXT_DIM at 48d368fa), which --v2 loads.
SD2_CROSS_ATTENTION = 1024


def _kohya_flags(architecture: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
    """sd-scripts loads an SD 2.x checkpoint only with --v2 and trains velocity only with
    --v_parameterization (library/train_util.py add_sd_models_arguments at 48d368fa)."""
    flags: dict[str, Any] = {}
    if architecture.get("cross_attention_dim") == SD2_CROSS_ATTENTION:
        flags["v2"] = True
    if inputs.get("prediction_type") == "v_prediction":
        flags["v_parameterization"] = True
    return flags


def _ai_toolkit_flags(architecture: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
    """ai-toolkit loads an SD 2.x UNet as arch sd2 and trains velocity only with is_v_pred
    (toolkit/config_modules.py ModelConfig at 27a03a91)."""
    flags: dict[str, Any] = {}
    if architecture.get("cross_attention_dim") == SD2_CROSS_ATTENTION:
        flags["model.arch"] = "sd2"
    if inputs.get("prediction_type") == "v_prediction":
        flags["model.is_v_pred"] = True
    return flags


def _onetrainer_type(architecture: Mapping[str, Any], inputs: Mapping[str, Any]) -> str:
    """OneTrainer's model_type for an SD 1.x or 2.x preset (modules/util/enum/ModelType.py at
    23df3832): 2.1 as the 768 px v-prediction model or its 512 px epsilon base."""
    if architecture.get("cross_attention_dim") != SD2_CROSS_ATTENTION:
        return "STABLE_DIFFUSION_15"
    v = inputs.get("prediction_type") == "v_prediction"
    return "STABLE_DIFFUSION_21" if v else "STABLE_DIFFUSION_21_BASE"


SD = Family(
    name="sd",
    workload="autofit.workloads.sd",
    libraries=(),
    loader="diffusers",
    unit="pixels",
    companions=("text_encoder", "vae"),
    lora_sets={"attention": DIFFUSION_ATTENTION},
    trainers={
        # Both encode every batch with the VAE and text encoder in the weight dtype; the LoRA
        # script's validation builds DiffusionPipeline.from_pretrained with only the UNet given
        # (diffusers 58eb52c0, examples/text_to_image/).
        "diffusers": DiffusersScripts(
            {
                "full": DiffusersScript("examples/text_to_image/train_text_to_image.py", "text_to_image", False, ("online",), ema=True),
                "lora": DiffusersScript("examples/text_to_image/train_text_to_image_lora.py", "text_to_image", True, ("online",),
                                        validation_reloads="loads a second text encoder and VAE for its validation pipeline (it passes only the UNet)"),
            }
        ),
        # sd-scripts 48d368fa: train_db.py is the SD 1.x/2.x full fine-tune that reads a
        # captioned DreamBooth-style dataset (fine_tune.py wants a metadata JSON); it trains the
        # text encoder too unless --stop_text_encoder_training is -1. The SD scripts have no
        # text-encoder output cache; their UNet (library/original_unet.py) runs its plain
        # attention without sdpa or xformers, and their sampling is train_util's shared one.
        "kohya": KohyaScripts(
            "train_db.py", "train_network.py", "networks.lora",
            always_fused_attention=False, sampling_moves_vae_first=True, text_encoder_cache=False,
            full_flags={"stop_text_encoder_training": -1}, model_flags=_kohya_flags,
        ),
        # SimpleTuner bc8e6ab (simpletuner/helpers/models/sd1x/model.py): StableDiffusion1 is
        # registered in model_metadata.json as sd1x; StableDiffusion2 registers sd2x only when
        # that module is imported, so SimpleTuner 4.10.1's --model_family choices lack it.
        "simpletuner": SimpleTunerModel(
            "sd1x", lora_targets=DIFFUSION_ATTENTION,
            refused_presets={"sd21": "SimpleTuner 4.10.1's --model_family choices have no sd2x (its model_metadata.json lists only sd1x)"},
        ),
        "sana": Refuse("Sana's train.py trains Sana models only"),
        "musubi": Refuse(MUSUBI_ONLY),
        # ai-toolkit 27a03a91: arch sd1 (sd2 for 2.x) in the legacy StableDiffusion class,
        # which quantizes no SD weight.
        "ai_toolkit": AiToolkitModel("sd1", quantizes=False, model_flags=_ai_toolkit_flags),
        # OneTrainer 23df3832: STABLE_DIFFUSION_15, or 2.1's (768 px v-prediction or 512 px
        # base), parts unet, text_encoder, vae; its FLOAT_8 leaves the convolutions in 16 bits.
        "onetrainer": OneTrainerModel(
            "STABLE_DIFFUSION_15", denoiser="unet", model_type_of=_onetrainer_type, fp8_matches=False
        ),
    },
)  # fmt: skip
