"""What the diffusion families share: noising for their training objectives, token ids, and
their language-model text encoders' padded prompts."""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch

from autofit.workloads.base import replaced


def flow_matching(latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rectified-flow objective Sana, SD3 and Flux train with: logit-normal timesteps t,
    the noisy latents (1 - t) x + t noise, and the velocity target noise - x."""
    noise = torch.randn_like(latents)
    t = torch.sigmoid(torch.randn(latents.shape[0], device=latents.device, dtype=latents.dtype))
    t_ = t.view(-1, *([1] * (latents.dim() - 1)))
    noisy = (1 - t_) * latents + t_ * noise
    return noisy, noise - latents, t


def pack(latents: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) latents as (B, H/2 * W/2, 4C) tokens of 2x2 patches, as the Flux and Qwen-Image
    pipelines pack them."""
    b, c, h, w = latents.shape
    patches = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return patches.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack(tokens: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Packed tokens back in the (B, C, H, W) layout of `shape`, to compare with the target."""
    b, c, h, w = shape
    return tokens.view(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def ddpm_noising(
    latents: torch.Tensor, alphas_cumprod: torch.Tensor, velocity: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The DDPM objective the UNet families and PixArt train with: a uniform timestep index per
    sample into the schedule's cumulative alphas, the noisy latents sqrt(a) x + sqrt(1 - a) noise,
    the target (the noise, or with `velocity` sqrt(a) noise - sqrt(1 - a) x, DDPMScheduler's
    get_velocity, which the scripts take for v_prediction), and the timesteps as fractions of the
    schedule."""
    steps_total = alphas_cumprod.shape[0]
    noise = torch.randn_like(latents)
    steps = torch.randint(0, steps_total, (latents.shape[0],), device=latents.device)
    alpha = alphas_cumprod[steps].view(-1, *([1] * (latents.dim() - 1))).to(latents.dtype)
    noisy = alpha.sqrt() * latents + (1 - alpha).sqrt() * noise
    target = alpha.sqrt() * noise - (1 - alpha).sqrt() * latents if velocity else noise
    return noisy, target, steps.to(latents.dtype) / steps_total


def token_ids(batch_size: int, tokens: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    return torch.randint(0, vocab_size, (batch_size, tokens), device=device)


def vocab(companion: dict) -> int:
    return int(companion["architecture"]["vocab_size"])


def _padded(*args: object, **kwargs: object) -> bool:
    """transformers' check whether SDPA may skip a text encoder's attention mask
    (masking_utils._ignore_causal_mask_sdpa for a decoder, _ignore_bidirectional_mask_sdpa for an
    encoder) as it answers a padded prompt: it may not. The check reads the mask's values, which
    fake tensors lack (there it answers the same without reading them); on real ones it makes
    scalar temporaries the fake step would not."""
    return False


def _answered_padded(check: str) -> AbstractContextManager[None]:
    # Imported here, when a text encoder runs: a run with cached encoders leaves transformers
    # out of its process (autofit/probe/libraries.py), and this module is every diffusion
    # workload's.
    import transformers.masking_utils as masking_utils

    return replaced(masking_utils, check, _padded)


def padded_prompts() -> AbstractContextManager[None]:
    """A language-model text encoder's mask check answered for a padded prompt, on every backend
    (HunyuanVideo's LLaVA-Llama-3, Qwen-Image's Qwen2.5-VL)."""
    return _answered_padded("_ignore_causal_mask_sdpa")


def padded_captions() -> AbstractContextManager[None]:
    """T5's mask check answered for a padded caption, on every backend (PixArt-Sigma's,
    Chroma's)."""
    return _answered_padded("_ignore_bidirectional_mask_sdpa")
