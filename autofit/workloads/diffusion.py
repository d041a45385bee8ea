"""What the diffusion families share: noising for their training objectives, and token ids."""

from __future__ import annotations

import torch


def flow_matching(latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The rectified-flow objective Sana, SD3 and Flux train with: logit-normal timesteps t,
    the noisy latents (1 - t) x + t noise, and the velocity target noise - x."""
    noise = torch.randn_like(latents)
    t = torch.sigmoid(torch.randn(latents.shape[0], device=latents.device, dtype=latents.dtype))
    t_ = t.view(-1, *([1] * (latents.dim() - 1)))
    noisy = (1 - t_) * latents + t_ * noise
    return noisy, noise - latents, t


def epsilon_noising(
    latents: torch.Tensor, alphas_cumprod: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The DDPM objective SDXL and PixArt train with: a uniform timestep index per sample into
    the schedule's cumulative alphas, the noisy latents sqrt(a) x + sqrt(1 - a) noise, the noise
    as the target, and the timesteps as fractions of the schedule."""
    steps_total = alphas_cumprod.shape[0]
    noise = torch.randn_like(latents)
    steps = torch.randint(0, steps_total, (latents.shape[0],), device=latents.device)
    alpha = alphas_cumprod[steps].view(-1, *([1] * (latents.dim() - 1))).to(latents.dtype)
    noisy = alpha.sqrt() * latents + (1 - alpha).sqrt() * noise
    return noisy, noise, steps.to(latents.dtype) / steps_total


def token_ids(batch_size: int, tokens: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    return torch.randint(0, vocab_size, (batch_size, tokens), device=device)


def vocab(companion: dict) -> int:
    return int(companion["architecture"]["vocab_size"])
