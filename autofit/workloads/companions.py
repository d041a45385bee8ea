"""The frozen models that run beside a trained one, built by kind with random weights.

A preset lists them under `companions` (`kind`, `dtype`, `architecture`); the kinds are a plain
dict, so a config never names code. Each builder takes the architecture as the library's own
config would spell it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# Imported here, not inside the builders: a library imported for the first time under fake
# tensors would make its module-level constant tensors fake.
from diffusers import (
    AutoencoderDC,
    AutoencoderKL,
    AutoencoderKLHunyuanVideo,
    AutoencoderKLQwenImage,
    AutoencoderKLWan,
)
from transformers import (
    CLIPTextConfig,
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPVisionConfig,
    CLIPVisionModel,
    Gemma2Config,
    Gemma2Model,
    LlamaConfig,
    LlamaModel,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    T5Config,
    T5EncoderModel,
    UMT5Config,
    UMT5EncoderModel,
)

from autofit.run_state import default_dtype

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _gemma2(architecture: dict[str, Any]) -> torch.nn.Module:
    return Gemma2Model(Gemma2Config(**architecture))


def _dc_ae(architecture: dict[str, Any]) -> torch.nn.Module:
    return AutoencoderDC(**architecture)


def _clip_text(architecture: dict[str, Any]) -> torch.nn.Module:
    return CLIPTextModel(CLIPTextConfig(**architecture))


def _clip_text_projection(architecture: dict[str, Any]) -> torch.nn.Module:
    return CLIPTextModelWithProjection(CLIPTextConfig(**architecture))


def _clip_vision(architecture: dict[str, Any]) -> torch.nn.Module:
    # The vision tower alone, as Wan 2.1's image-to-video pipeline runs its image encoder (its
    # penultimate layer's hidden states are the image embedding).
    return CLIPVisionModel(CLIPVisionConfig(**architecture))


def _t5_encoder(architecture: dict[str, Any]) -> torch.nn.Module:
    return T5EncoderModel(T5Config(**architecture))


def _autoencoder_kl(architecture: dict[str, Any]) -> torch.nn.Module:
    return AutoencoderKL(**architecture)


def _umt5_encoder(architecture: dict[str, Any]) -> torch.nn.Module:
    return UMT5EncoderModel(UMT5Config(**architecture))


def _autoencoder_kl_wan(architecture: dict[str, Any]) -> torch.nn.Module:
    return AutoencoderKLWan(**architecture)


def _llama_model(architecture: dict[str, Any]) -> torch.nn.Module:
    # A decoder without its LM head, as HunyuanVideo runs LLaVA-Llama-3's language model.
    return LlamaModel(LlamaConfig(**architecture))


def _autoencoder_kl_hunyuan_video(architecture: dict[str, Any]) -> torch.nn.Module:
    return AutoencoderKLHunyuanVideo(**architecture)


def _qwen2_5_vl(architecture: dict[str, Any]) -> torch.nn.Module:
    # The whole vision-language model with its LM head, as Qwen-Image's trainers load its text
    # encoder: a text prompt runs the language model and the head, the vision tower stays idle.
    return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**architecture))


def _autoencoder_kl_qwen_image(architecture: dict[str, Any]) -> torch.nn.Module:
    return AutoencoderKLQwenImage(**architecture)


KINDS: dict[str, Callable[[dict[str, Any]], torch.nn.Module]] = {
    "gemma2": _gemma2,
    "dc_ae": _dc_ae,
    "clip_text": _clip_text,
    "clip_text_projection": _clip_text_projection,
    "clip_vision": _clip_vision,
    "t5_encoder": _t5_encoder,
    "autoencoder_kl": _autoencoder_kl,
    "umt5_encoder": _umt5_encoder,
    "autoencoder_kl_wan": _autoencoder_kl_wan,
    "llama_model": _llama_model,
    "autoencoder_kl_hunyuan_video": _autoencoder_kl_hunyuan_video,
    "qwen2_5_vl": _qwen2_5_vl,
    "autoencoder_kl_qwen_image": _autoencoder_kl_qwen_image,
}


def companion_dtype(spec: dict[str, Any]) -> torch.dtype:
    return DTYPES[spec.get("dtype", "bf16")]


def build_companion(spec: dict[str, Any], dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Build one companion under the caller's device, in its own dtype unless `dtype` says."""
    with default_dtype(dtype or companion_dtype(spec)):
        return KINDS[spec["kind"]](spec["architecture"])
