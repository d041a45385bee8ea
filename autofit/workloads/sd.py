"""Stable Diffusion 1.x and 2.x: `UNet2DConditionModel` on 4-channel VAE latents, conditioned on
one CLIP text encoder's last hidden state over 77 tokens (CLIP ViT-L/14 for 1.x; OpenCLIP ViT-H
as a 23-layer `CLIPTextModel` for 2.x, whose last layer is OpenCLIP's penultimate), with no
pooled or added conditioning. The objective is the preset's (autofit/workloads/unet.py): noise
for 1.5, velocity for 2.1 at 768 px. The training scripts encode so
(diffusers' train_text_to_image.py: `text_encoder(input_ids, return_dict=False)[0]`)."""

from __future__ import annotations

import torch

from autofit.workloads.base import Batch
from autofit.workloads.diffusion import token_ids, vocab
from autofit.workloads.latent import Conditions
from autofit.workloads.unet import UNetDiffusion


class SDWorkload(UNetDiffusion):
    def conditions(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> Conditions:
        inputs = self.preset.inputs
        shape = (batch_size, inputs["clip_tokens"], inputs["text_dim"])
        return {"text": torch.randn(shape, device=device, dtype=dtype)}

    def tokens(self, batch_size: int, device: torch.device) -> Batch:
        encoder = self.preset.companions["text_encoder"]
        return {
            "text_encoder": token_ids(
                batch_size, self.preset.inputs["clip_tokens"], vocab(encoder), device
            )
        }

    def encode_text(self, tokens: Batch, companions: dict[str, torch.nn.Module]) -> Conditions:
        out = companions["text_encoder"](input_ids=tokens["text_encoder"], return_dict=False)
        return {"text": out[0]}


WORKLOAD = SDWorkload
