"""Sana (NVlabs): `SanaTransformer2DModel` trained with flow matching on DC-AE latents, captions
embedded by Gemma-2 (300 tokens, with their attention mask)."""

from __future__ import annotations

import torch
from diffusers import SanaTransformer2DModel

from autofit.workloads.latent import CaptionDiffusion, Conditions


class SanaWorkload(CaptionDiffusion):
    def build_model(self, frozen_dtype: torch.dtype) -> torch.nn.Module:
        return SanaTransformer2DModel(**self.preset.architecture)

    def predict(
        self, model: torch.nn.Module, noisy: torch.Tensor, t: torch.Tensor, conditions: Conditions
    ) -> torch.Tensor:
        return model(
            noisy,
            encoder_hidden_states=conditions["text"],
            timestep=t * 1000,
            encoder_attention_mask=conditions["text_mask"],
            return_dict=False,
        )[0]


WORKLOAD = SanaWorkload
