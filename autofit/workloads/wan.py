"""Wan: `WanTransformer3DModel` trained with flow matching on the Wan VAE's 16-channel latents
(4x in time after the first frame, 8x in space, then 1x2x2 patches), conditioned on umT5-XXL's
512-token prompt embedding, as Wan's pipeline pads it.

An image-to-video preset (`inputs.condition_channels`: Wan 2.2's I2V experts) also takes the
clip's first frame: the VAE's latents of a clip that is that frame followed by black ones, beside
a 4-channel mask of which latent frames it gives (`WanImageToVideoPipeline`'s condition), stacked
on the noisy latents' channels (16 + 4 + 16 = the model's 36 in_channels).
"""

from __future__ import annotations

import torch
from diffusers import WanTransformer3DModel

from autofit.workloads.base import Batch
from autofit.workloads.diffusion import token_ids, vocab
from autofit.workloads.latent import Conditions, channel_stats
from autofit.workloads.video import VideoDiffusion


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
        conditions = {"text": text}
        if self.condition_channels:  # cached with the latents, as the trainers cache them
            _, _, frames, height, width = self.latent_shape(batch_size, resolution)
            shape = (batch_size, self.condition_channels, frames, height, width)
            conditions["image"] = torch.randn(shape, device=device, dtype=dtype)
        return conditions

    @property
    def condition_channels(self) -> int:
        """The channels of an image-to-video model's first-frame condition; 0 for text-to-video."""
        return int(self.preset.inputs.get("condition_channels", 0))

    def encode(
        self, raw: Batch, companions: dict[str, torch.nn.Module], dtype: torch.dtype
    ) -> Batch:
        batch = super().encode(raw, companions, dtype)
        if self.condition_channels:
            with torch.no_grad():
                first = torch.zeros_like(raw["images"])
                first[:, :, :1] = raw["images"][:, :, :1]  # the first frame, then black ones
                latents = self.encode_latents(companions["vae"], first)
                b, _, frames, height, width = latents.shape
                given = self.condition_channels - latents.shape[1]  # the mask's channels
                mask = torch.zeros(b, given, frames, height, width, device=latents.device)
                mask[:, :, 0] = 1  # only the first latent frame is given
                batch["image"] = torch.cat([mask.to(latents.dtype), latents], dim=1).to(dtype)
        return batch

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
        if "image" in conditions:  # image-to-video: the condition beside the noisy latents
            noisy = torch.cat([noisy, conditions["image"]], dim=1)
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
        mean, std = channel_stats(vae, latents)
        return (latents - mean) / std

    def decode_latents(self, vae: torch.nn.Module, latents: torch.Tensor) -> torch.Tensor:
        dtype = next(vae.parameters()).dtype
        mean, std = channel_stats(vae, latents)
        return vae.decode((latents * std + mean).to(dtype), return_dict=False)[0]


WORKLOAD = WanWorkload
