"""FLUX.1: `FluxTransformer2DModel` trained with flow matching on 16-channel VAE latents packed
into 2x2 patches, conditioned on T5-XXL (512 tokens) and CLIP-L's pooled embedding, with the
guidance value Flux.1-dev is distilled on."""

from __future__ import annotations

import torch
from diffusers import FluxTransformer2DModel

from autofit.workloads.base import Batch
from autofit.workloads.diffusion import pack, token_ids, unpack, vocab
from autofit.workloads.latent import Conditions, LatentDiffusion

GUIDANCE = 3.5


class FluxWorkload(LatentDiffusion):
    guidance_batch = 1  # guidance-distilled: no negative prompt
    text_encoders = ("text_encoder", "text_encoder_2")

    def build_model(self, frozen_dtype: torch.dtype) -> torch.nn.Module:
        return FluxTransformer2DModel(**self.preset.architecture)

    def conditions(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> Conditions:
        return self.text_and_pooled(batch_size, self.preset.inputs["t5_tokens"], device, dtype)

    def tokens(self, batch_size: int, device: torch.device) -> Batch:
        inputs, companions = self.preset.inputs, self.preset.companions
        return {
            "text_encoder": token_ids(
                batch_size, inputs["clip_tokens"], vocab(companions["text_encoder"]), device
            ),
            "text_encoder_2": token_ids(
                batch_size, inputs["t5_tokens"], vocab(companions["text_encoder_2"]), device
            ),
        }

    def encode_text(self, tokens: Batch, companions: dict[str, torch.nn.Module]) -> Conditions:
        pooled = companions["text_encoder"](input_ids=tokens["text_encoder"]).pooler_output
        text = companions["text_encoder_2"](input_ids=tokens["text_encoder_2"]).last_hidden_state
        return {"text": text, "pooled": pooled}

    def predict(
        self, model: torch.nn.Module, noisy: torch.Tensor, t: torch.Tensor, conditions: Conditions
    ) -> torch.Tensor:
        b, _, h, w = noisy.shape
        tokens, device = (h // 2) * (w // 2), noisy.device
        prediction = model(
            hidden_states=pack(noisy),
            timestep=t,
            guidance=torch.full((b,), GUIDANCE, device=device, dtype=noisy.dtype),
            pooled_projections=conditions["pooled"],
            encoder_hidden_states=conditions["text"],
            txt_ids=torch.zeros(conditions["text"].shape[1], 3, device=device, dtype=noisy.dtype),
            img_ids=torch.zeros(tokens, 3, device=device, dtype=noisy.dtype),
            return_dict=False,
        )[0]
        return unpack(prediction, noisy.shape)


WORKLOAD = FluxWorkload
