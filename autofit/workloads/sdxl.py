"""SDXL: `UNet2DConditionModel` trained to predict the noise (DDPM, epsilon) on 4-channel VAE
latents, conditioned on CLIP-L and CLIP-G (77 tokens, penultimate layers concatenated), CLIP-G's
pooled embedding and the six size-and-crop conditioning values."""

from __future__ import annotations

import torch
from diffusers import UNet2DConditionModel

from autofit.workloads.base import Batch
from autofit.workloads.diffusion import epsilon_noising, token_ids, vocab
from autofit.workloads.latent import Conditions, LatentDiffusion

STEPS = 1000


def _alphas_cumprod(device: torch.device) -> torch.Tensor:
    """SDXL's scaled-linear beta schedule."""
    betas = torch.linspace(0.00085**0.5, 0.012**0.5, STEPS, device=device, dtype=torch.float32) ** 2
    return torch.cumprod(1 - betas, dim=0)


class SDXLWorkload(LatentDiffusion):
    text_encoders = ("text_encoder", "text_encoder_2")

    def build_model(self, frozen_dtype: torch.dtype) -> torch.nn.Module:
        return self.unet()

    def unet(self) -> torch.nn.Module:
        """The preset's UNet (diffusers takes its per-level lists as tuples)."""
        architecture = {
            k: tuple(v) if isinstance(v, list) else v for k, v in self.preset.architecture.items()
        }
        return UNet2DConditionModel(**architecture)

    def conditions(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> Conditions:
        conditions = self.text_and_pooled(
            batch_size, self.preset.inputs["clip_tokens"], device, dtype
        )
        # the size-and-crop conditioning: original size, crop offset, target size
        return {**conditions, "time_ids": torch.randn(batch_size, 6, device=device, dtype=dtype)}

    def tokens(self, batch_size: int, device: torch.device) -> Batch:
        tokens, companions = self.preset.inputs["clip_tokens"], self.preset.companions
        return {
            name: token_ids(batch_size, tokens, vocab(companions[name]), device)
            for name in self.text_encoders
        }

    def encode_text(self, tokens: Batch, companions: dict[str, torch.nn.Module]) -> Conditions:
        hidden = []
        for name in self.text_encoders:
            out = companions[name](input_ids=tokens[name], output_hidden_states=True)
            hidden.append(out.hidden_states[-2])
        batch = tokens["text_encoder"].shape[0]
        return {
            "text": torch.cat(hidden, dim=-1),
            "pooled": out.text_embeds,
            "time_ids": torch.randn(
                batch, 6, device=out.text_embeds.device, dtype=out.text_embeds.dtype
            ),
        }

    def noising(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return epsilon_noising(latents, _alphas_cumprod(latents.device))

    def predict(
        self, model: torch.nn.Module, noisy: torch.Tensor, t: torch.Tensor, conditions: Conditions
    ) -> torch.Tensor:
        return model(
            noisy,
            (t * (STEPS - 1)).long(),
            encoder_hidden_states=conditions["text"],
            added_cond_kwargs={
                "text_embeds": conditions["pooled"],
                "time_ids": conditions["time_ids"],
            },
            return_dict=False,
        )[0]


WORKLOAD = SDXLWorkload
