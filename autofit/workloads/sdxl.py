"""SDXL: `UNet2DConditionModel` trained to predict the noise (DDPM, epsilon) on 4-channel VAE
latents, conditioned on CLIP-L and CLIP-G (77 tokens, penultimate layers concatenated), CLIP-G's
pooled embedding and the six size-and-crop conditioning values (autofit/workloads/unet.py holds
what it shares with SD 1.x/2.x)."""

from __future__ import annotations

import torch

from autofit.workloads.base import Batch
from autofit.workloads.diffusion import token_ids, vocab
from autofit.workloads.latent import Conditions
from autofit.workloads.unet import UNetDiffusion


class SDXLWorkload(UNetDiffusion):
    text_encoders = ("text_encoder", "text_encoder_2")

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

    def added_conditions(self, conditions: Conditions) -> dict[str, torch.Tensor]:
        return {"text_embeds": conditions["pooled"], "time_ids": conditions["time_ids"]}


WORKLOAD = SDXLWorkload
