"""Sana (NVlabs): `SanaTransformer2DModel` trained with flow matching on DC-AE latents, captions
embedded by Gemma-2 (300 tokens, with their attention mask)."""

from __future__ import annotations

from typing import Any

import torch
from diffusers import SanaTransformer2DModel

from autofit.workloads.base import Batch
from autofit.workloads.diffusion import token_ids, vocab
from autofit.workloads.latent import Conditions, LatentDiffusion


class SanaWorkload(LatentDiffusion):
    def build_model(self, frozen_dtype: torch.dtype) -> torch.nn.Module:
        return SanaTransformer2DModel(**self.preset.architecture)

    def conditions(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> Conditions:
        tokens, width = self.preset.inputs["text_tokens"], self.preset.inputs["text_dim"]
        return {
            "text": torch.randn(batch_size, tokens, width, device=device, dtype=dtype),
            "text_mask": torch.ones(batch_size, tokens, device=device, dtype=dtype),
        }

    def tokens(self, batch_size: int, device: torch.device) -> Batch:
        count = self.preset.inputs["text_tokens"]
        return {
            "ids": token_ids(
                batch_size, count, vocab(self.preset.companions["text_encoder"]), device
            ),
            "mask": torch.ones(batch_size, count, device=device, dtype=torch.long),
        }

    def encode_text(self, tokens: Batch, companions: dict[str, torch.nn.Module]) -> Conditions:
        text = companions["text_encoder"](
            input_ids=tokens["ids"], attention_mask=tokens["mask"]
        ).last_hidden_state
        return {"text": text, "text_mask": tokens["mask"].to(text.dtype)}

    def next_block_inputs(self, output: Any, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        # SanaTransformerBlock returns the hidden states alone; the rest of its inputs (the
        # masks, the timestep embedding, the patch grid) are the same for every block.
        return (output, *inputs[1:])

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
