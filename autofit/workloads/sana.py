"""Sana (NVlabs): `SanaTransformer2DModel` trained with flow matching on DC-AE latents."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from diffusers import SanaTransformer2DModel

from autofit.workloads.base import CheckpointFn, Workload


class SanaWorkload(Workload):
    def build_model(self) -> torch.nn.Module:
        return SanaTransformer2DModel(**self.preset.architecture)

    def make_batch(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> dict[str, torch.Tensor]:
        inputs = self.preset.inputs
        side = resolution // inputs["latent_downsample"]
        shape = (batch_size, inputs["latent_channels"], side, side)
        return {
            # Precomputed VAE latents and caption embeddings, as Sana's trainer loads them.
            "latents": torch.randn(shape, device=device, dtype=dtype),
            "text": torch.randn(
                batch_size, inputs["text_tokens"], inputs["text_dim"], device=device, dtype=dtype
            ),
            "text_mask": torch.ones(batch_size, inputs["text_tokens"], device=device, dtype=dtype),
        }

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        latents = batch["latents"]
        noise = torch.randn_like(latents)
        # Logit-normal timesteps and the rectified-flow path, as Sana trains.
        t = torch.sigmoid(torch.randn(latents.shape[0], device=latents.device, dtype=latents.dtype))
        t_ = t.view(-1, 1, 1, 1)
        noisy = (1 - t_) * latents + t_ * noise
        pred: Any = model(
            noisy,
            encoder_hidden_states=batch["text"],
            timestep=t * 1000,
            encoder_attention_mask=batch["text_mask"],
            return_dict=False,
        )[0]
        return F.mse_loss(pred.float(), (noise - latents).float())

    def enable_checkpointing(self, model: torch.nn.Module, checkpoint: CheckpointFn) -> None:
        model.enable_gradient_checkpointing(checkpoint)  # type: ignore[operator]


WORKLOAD = SanaWorkload
