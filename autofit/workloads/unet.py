"""The UNet latent-diffusion families (Stable Diffusion 1.x/2.x and SDXL): a
`UNet2DConditionModel` over 4-channel VAE latents, trained on DDPM's scaled-linear schedule to
predict the noise (`epsilon`) or the velocity (`v_prediction`, SD 2.x at 768 px), as the
preset's `inputs.prediction_type` says (its scheduler config's; epsilon when it says nothing).

A family says what its text conditioning is, and what the UNet takes beside it
(`added_conditions`: SDXL's pooled embedding and size-and-crop values; none for SD 1.x/2.x).
"""

from __future__ import annotations

from typing import Any

import torch
from diffusers import UNet2DConditionModel

from autofit.workloads.diffusion import ddpm_noising
from autofit.workloads.latent import Conditions, LatentDiffusion

STEPS = 1000


def _alphas_cumprod(device: torch.device) -> torch.Tensor:
    """The scaled-linear beta schedule of every Stable Diffusion scheduler config (beta 0.00085
    to 0.012 over 1000 steps)."""
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, STEPS, device=device, dtype=torch.float32) ** 2
    return torch.cumprod(1 - betas, dim=0)


class UNetDiffusion(LatentDiffusion):
    def build_model(self, frozen_dtype: torch.dtype) -> torch.nn.Module:
        return self.unet()

    def unet(self) -> torch.nn.Module:
        """The preset's UNet (diffusers takes its per-level lists as tuples)."""
        architecture = {
            k: tuple(v) if isinstance(v, list) else v for k, v in self.preset.architecture.items()
        }
        return UNet2DConditionModel(**architecture)

    @property
    def prediction_type(self) -> str:
        return str(self.preset.inputs.get("prediction_type", "epsilon"))

    def noising(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        velocity = self.prediction_type == "v_prediction"
        return ddpm_noising(latents, _alphas_cumprod(latents.device), velocity)

    def added_conditions(self, conditions: Conditions) -> dict[str, torch.Tensor] | None:
        """What the UNet takes beside the text embeddings (`added_cond_kwargs`), if anything."""
        return None

    def predict(
        self, model: torch.nn.Module, noisy: torch.Tensor, t: torch.Tensor, conditions: Conditions
    ) -> torch.Tensor:
        out: Any = model(
            noisy,
            (t * (STEPS - 1)).long(),
            encoder_hidden_states=conditions["text"],
            added_cond_kwargs=self.added_conditions(conditions),
            return_dict=False,
        )
        return out[0]
