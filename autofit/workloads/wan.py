"""Wan: `WanTransformer3DModel` trained with flow matching on the Wan VAE's 16-channel latents
(4x in time after the first frame, 8x in space, then 1x2x2 patches), conditioned on umT5-XXL's
512-token prompt embedding, as Wan's pipeline pads it."""

from __future__ import annotations

import torch
from diffusers import WanTransformer3DModel

from autofit.workloads.base import Batch
from autofit.workloads.diffusion import token_ids, vocab
from autofit.workloads.latent import Conditions
from autofit.workloads.video import VideoDiffusion


def _channel_stats(vae: torch.nn.Module, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-channel latent mean and standard deviation the Wan VAE's latents are scaled by."""
    shape = (1, -1, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, device=like.device, dtype=like.dtype)
    std = torch.tensor(vae.config.latents_std, device=like.device, dtype=like.dtype)
    return mean.view(shape), std.view(shape)


class WanWorkload(VideoDiffusion):
    text_encoders = ("text_encoder",)

    def build_model(self, frozen_dtype: torch.dtype) -> torch.nn.Module:
        return WanTransformer3DModel(**self.preset.architecture)

    def conditions(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> Conditions:
        inputs = self.preset.inputs
        text = torch.randn(
            batch_size, inputs["text_tokens"], inputs["text_dim"], device=device, dtype=dtype
        )
        return {"text": text}

    def tokens(self, batch_size: int, device: torch.device) -> Batch:
        count = self.preset.inputs["text_tokens"]
        size = vocab(self.preset.companions["text_encoder"])
        return {"text_encoder": token_ids(batch_size, count, size, device)}

    def encode_text(self, tokens: Batch, companions: dict[str, torch.nn.Module]) -> Conditions:
        text = companions["text_encoder"](input_ids=tokens["text_encoder"]).last_hidden_state
        return {"text": text}

    def predict(
        self, model: torch.nn.Module, noisy: torch.Tensor, t: torch.Tensor, conditions: Conditions
    ) -> torch.Tensor:
        return model(
            hidden_states=noisy,
            timestep=t * 1000,  # Wan's scheduler counts timesteps to 1000
            encoder_hidden_states=conditions["text"],
            return_dict=False,
        )[0]

    def next_block_inputs(self, output: torch.Tensor, inputs: tuple) -> tuple:
        # A Wan block takes (hidden_states, encoder_hidden_states, temb, rotary_emb) and
        # returns the hidden states.
        return (output, *inputs[1:])

    def encode_latents(self, vae: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
        dtype = next(vae.parameters()).dtype
        latents = vae.encode(images.to(dtype)).latent_dist.sample()
        mean, std = _channel_stats(vae, latents)
        return (latents - mean) / std

    def decode_latents(self, vae: torch.nn.Module, latents: torch.Tensor) -> torch.Tensor:
        dtype = next(vae.parameters()).dtype
        mean, std = _channel_stats(vae, latents)
        return vae.decode((latents * std + mean).to(dtype), return_dict=False)[0]


WORKLOAD = WanWorkload
