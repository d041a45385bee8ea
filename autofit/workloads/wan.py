"""Wan: `WanTransformer3DModel` trained with flow matching on the Wan VAE's latents (Wan 2.1's
16 channels, 4x in time after the first frame, 8x in space; Wan 2.2's for the 5B, 48 channels at
16x), then 1x2x2 patches, conditioned on umT5-XXL's 512-token prompt embedding, as Wan's pipeline
pads it.

The image-to-video presets also take the clip's first frame, as their pipelines give it:

- `inputs.condition_channels` (Wan 2.1's and 2.2's I2V 14B): the VAE's latents of a clip that is
  that frame followed by black ones, beside a 4-channel mask of which latent frames it gives
  (`WanImageToVideoPipeline`'s condition), stacked on the noisy latents' channels (16 + 4 + 16 =
  the model's 36 in_channels);
- `inputs.image_tokens` (Wan 2.1's I2V): the CLIP vision tower's penultimate hidden states of the
  frame (257 tokens x 1280), which the model's image embedder projects and every block's
  cross-attention attends besides the prompt;
- `inputs.first_frame_in_latents` (Wan 2.2's TI2V 5B): the clip's first latent frame stays clean
  (the causal VAE encodes the first frame alone, so it is the frame's own latents) and its tokens
  are given timestep 0, the others the sample's: a timestep per token (the pipeline's
  `expand_timesteps`), so the blocks' modulation is per token too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
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
        if self.image_tokens:  # the CLIP embedding, cached with the latents as musubi-tuner does
            shape = (batch_size, self.image_tokens, inputs["image_dim"])
            conditions["image_embeds"] = torch.randn(shape, device=device, dtype=dtype)
        return conditions

    @property
    def condition_channels(self) -> int:
        """The channels of an image-to-video model's first-frame condition; 0 for text-to-video."""
        return int(self.preset.inputs.get("condition_channels", 0))

    @property
    def image_tokens(self) -> int:
        """The tokens of the first frame's CLIP embedding (Wan 2.1's I2V); 0 without one."""
        return int(self.preset.inputs.get("image_tokens", 0))

    @property
    def first_frame_in_latents(self) -> bool:
        """Whether the first latent frame is the given frame's, at timestep 0 (Wan 2.2's TI2V)."""
        return bool(self.preset.inputs.get("first_frame_in_latents", False))

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
        if self.image_tokens:
            with torch.no_grad():
                embeds = self.encode_image(companions["image_encoder"], raw["images"][:, :, 0])
                batch["image_embeds"] = embeds.to(dtype)
        return batch

    def encode_image(self, encoder: torch.nn.Module, frames: torch.Tensor) -> torch.Tensor:
        """The CLIP vision tower's penultimate hidden states of each first frame, resized to its
        input size (WanImageToVideoPipeline.encode_image)."""
        size = encoder.config.image_size
        pixels = F.interpolate(frames, size=(size, size), mode="bilinear")
        dtype = next(encoder.parameters()).dtype
        out = encoder(pixel_values=pixels.to(dtype), output_hidden_states=True)
        return out.hidden_states[-2]

    def noising(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        noisy, target, t = super().noising(latents)
        if self.first_frame_in_latents:  # the given frame stays clean in the model's input
            noisy = torch.cat([latents[:, :, :1], noisy[:, :, 1:]], dim=2)
        return noisy, target, t

    def timesteps(self, noisy: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Wan's timesteps (counted to 1000) for t in [0, 1]: one per sample, or with the first
        frame in the latents one per token, 0 on the first latent frame's (the pipeline's mask
        times t)."""
        if not self.first_frame_in_latents:
            return t * 1000
        _, _, frames, height, width = noisy.shape
        _, patch_h, patch_w = self.preset.architecture["patch_size"]
        mask = torch.ones(frames, (height // patch_h) * (width // patch_w), device=noisy.device)
        mask[0] = 0
        return mask.flatten().to(t.dtype)[None] * (t * 1000)[:, None]

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
            timestep=self.timesteps(noisy, t),
            encoder_hidden_states=conditions["text"],
            encoder_hidden_states_image=conditions.get("image_embeds"),
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
