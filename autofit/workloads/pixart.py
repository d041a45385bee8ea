"""PixArt-Sigma: `PixArtTransformer2DModel` trained to predict the noise (DDPM, epsilon, on the
linear beta schedule of its published scheduler config) on the SDXL VAE's 4-channel latents,
captions embedded by T5-XXL (300 tokens, with their attention mask).

The model outputs twice the latent channels (a learned variance beside the noise); SimpleTuner
keeps the first half and trains it alone with the mean squared error
(helpers/models/pixart/model.py `_model_predict_single`, bghira/SimpleTuner bc8e6ab), and the
diffusers pipeline takes the same half when it samples. PixArt-Sigma's published configs set no
size or aspect-ratio conditions (`use_additional_conditions` false, or left out at a sample size
other than 128, which diffusers reads as false), so the pipeline hands the transformer
`added_cond_kwargs` of None values (pipeline_pixart_sigma.py) and its timestep embedding takes
the timestep alone.
"""

from __future__ import annotations

import torch
from diffusers import PixArtTransformer2DModel

from autofit.workloads.base import Batch
from autofit.workloads.diffusion import ddpm_noising, padded_captions
from autofit.workloads.latent import CaptionDiffusion, Conditions

STEPS = 1000
# The "linear" betas of its published scheduler (PixArt-Sigma-XL-2-1024-MS scheduler_config.json).
BETA_START, BETA_END = 0.0001, 0.02


def _alphas_cumprod(device: torch.device) -> torch.Tensor:
    betas = torch.linspace(BETA_START, BETA_END, STEPS, device=device, dtype=torch.float32)
    return torch.cumprod(1 - betas, dim=0)


class PixArtWorkload(CaptionDiffusion):
    def build_model(self, frozen_dtype: torch.dtype) -> torch.nn.Module:
        return PixArtTransformer2DModel(**self.preset.architecture)

    def tokens(self, batch_size: int, device: torch.device) -> Batch:
        # A caption shorter than the 300 tokens the pipeline pads it to, as nearly every one is:
        # the mask's zeros make T5 attend through its 4-D padding mask, as in training (how
        # many zeros changes no shape).
        tokens = super().tokens(batch_size, device)
        tokens["mask"][:, tokens["mask"].shape[1] // 2 :] = 0
        return tokens

    def encode_text(self, tokens: Batch, companions: dict[str, torch.nn.Module]) -> Conditions:
        with padded_captions():
            return super().encode_text(tokens, companions)

    def noising(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return ddpm_noising(latents, _alphas_cumprod(latents.device))

    def predict(
        self, model: torch.nn.Module, noisy: torch.Tensor, t: torch.Tensor, conditions: Conditions
    ) -> torch.Tensor:
        output = model(
            noisy,
            encoder_hidden_states=conditions["text"],
            timestep=(t * (STEPS - 1)).long(),
            encoder_attention_mask=conditions["text_mask"],
            added_cond_kwargs={"resolution": None, "aspect_ratio": None},
            return_dict=False,
        )[0]
        return output.chunk(2, dim=1)[0]  # the noise; the learned variance is not trained


WORKLOAD = PixArtWorkload
