"""Stable Diffusion 3.5: `SD3Transformer2DModel` trained with flow matching on 16-channel VAE
latents, conditioned on CLIP-L and CLIP-G (77 tokens each, penultimate layer, concatenated and
padded to T5's width) followed by T5-XXL (256 tokens), and on the two CLIPs' pooled embeddings."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers import SD3Transformer2DModel

from autofit.workloads.base import Batch
from autofit.workloads.diffusion import token_ids, vocab
from autofit.workloads.latent import Conditions, LatentDiffusion


class SD3Workload(LatentDiffusion):
    text_encoders = ("text_encoder", "text_encoder_2", "text_encoder_3")

    def build_model(self, frozen_dtype: torch.dtype) -> torch.nn.Module:
        return SD3Transformer2DModel(**self.preset.architecture)

    def conditions(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> Conditions:
        tokens = self.preset.inputs["clip_tokens"] + self.preset.inputs["t5_tokens"]
        return self.text_and_pooled(batch_size, tokens, device, dtype)

    def tokens(self, batch_size: int, device: torch.device, t5_tokens: int | None = None) -> Batch:
        """Token ids for each text encoder; `t5_tokens` overrides the preset's T5 length."""
        inputs, companions = self.preset.inputs, self.preset.companions
        lengths = {"text_encoder_3": t5_tokens or inputs["t5_tokens"]}
        return {
            name: token_ids(
                batch_size,
                lengths.get(name, inputs["clip_tokens"]),
                vocab(companions[name]),
                device,
            )
            for name in self.text_encoders
        }

    def encode_text(self, tokens: Batch, companions: dict[str, torch.nn.Module]) -> Conditions:
        clips, pooled = [], []
        for name in ("text_encoder", "text_encoder_2"):
            out = companions[name](input_ids=tokens[name], output_hidden_states=True)
            clips.append(out.hidden_states[-2])
            pooled.append(out.text_embeds)
        t5 = companions["text_encoder_3"](input_ids=tokens["text_encoder_3"]).last_hidden_state
        clip = torch.cat(clips, dim=-1)
        clip = F.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
        return {
            "text": torch.cat([clip, t5.to(clip.dtype)], dim=-2),
            "pooled": torch.cat(pooled, dim=-1),
        }

    def predict(
        self, model: torch.nn.Module, noisy: torch.Tensor, t: torch.Tensor, conditions: Conditions
    ) -> torch.Tensor:
        return model(
            hidden_states=noisy,
            encoder_hidden_states=conditions["text"],
            pooled_projections=conditions["pooled"],
            timestep=t * 1000,
            return_dict=False,
        )[0]


WORKLOAD = SD3Workload
