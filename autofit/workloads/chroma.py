"""Chroma: `ChromaTransformer2DModel` trained with flow matching on FLUX.1's 16-channel latents
packed into 2x2 patches (as FLUX.1's workload packs them), conditioned on T5-XXL alone (the
preset's `t5_tokens`) with the prompt's attention mask, and no guidance: the model makes every
block's modulation from the timestep itself (its distilled guidance layer).

The mask is what the trainers hand the model: ChromaPipeline's (diffusers 0.42,
`_get_t5_prompt_embeds`) keeps the prompt's tokens and the first padding token; SimpleTuner's
Chroma (helpers/models/chroma/model.py at bc8e6ab7) caches it, makes it boolean and extends it
over the image tokens, which the model expands to a (B, 1, S, S) mask in every block.
"""

from __future__ import annotations

import warnings

import torch
from diffusers import ChromaTransformer2DModel

from autofit.workloads.base import Batch
from autofit.workloads.diffusion import pack, padded_captions, token_ids, unpack, vocab
from autofit.workloads.flux import FluxWorkload, position_ids
from autofit.workloads.latent import Conditions


def prompt_mask(tokenizer_mask: torch.Tensor) -> torch.Tensor:
    """The mask Chroma attends its prompt with: the tokenizer's, and the first padding token."""
    positions = torch.arange(tokenizer_mask.shape[1], device=tokenizer_mask.device)
    return positions.unsqueeze(0) <= tokenizer_mask.sum(dim=1, keepdim=True)


class ChromaWorkload(FluxWorkload):
    # Real classifier-free guidance, but ChromaPipeline runs the negative prompt as a second call
    # of the model (pipeline_chroma.py's denoising loop), so one call holds a batch of 1.
    guidance_batch = 1
    text_encoders = ("text_encoder",)  # T5-XXL, ChromaPipeline's text_encoder

    def build_model(self, frozen_dtype: torch.dtype) -> torch.nn.Module:
        with warnings.catch_warnings():
            # diffusers' own Chroma module builds FluxPosEmbed from its deprecated home, and
            # diffusers warns the user about its own import (diffusers 0.42.1): not theirs to fix.
            warnings.filterwarnings("ignore", message=".*FluxPosEmbed.*", category=FutureWarning)
            return ChromaTransformer2DModel(**self.preset.architecture)

    def conditions(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> Conditions:
        inputs = self.preset.inputs
        shape = (batch_size, inputs["t5_tokens"])
        return {
            "text": torch.randn(*shape, inputs["text_dim"], device=device, dtype=dtype),
            "mask": torch.ones(shape, device=device, dtype=torch.bool),  # cached beside it
        }

    def tokens(self, batch_size: int, device: torch.device) -> Batch:
        count = self.preset.inputs["t5_tokens"]
        # A caption shorter than the tokens it is padded to, as nearly every one is (how many
        # are padding changes no shape).
        mask = torch.ones(batch_size, count, device=device, dtype=torch.long)
        mask[:, count // 2 :] = 0
        size = vocab(self.preset.companions["text_encoder"])
        return {
            "text_encoder": token_ids(batch_size, count, size, device),
            "text_encoder_mask": mask,
        }

    def encode_text(self, tokens: Batch, companions: dict[str, torch.nn.Module]) -> Conditions:
        mask = tokens["text_encoder_mask"]
        # Unlike FLUX.1's, Chroma's T5 reads the tokenizer's mask.
        with padded_captions():
            text = companions["text_encoder"](
                input_ids=tokens["text_encoder"], attention_mask=mask
            ).last_hidden_state
        return {"text": text, "mask": prompt_mask(mask)}

    def predict(
        self, model: torch.nn.Module, noisy: torch.Tensor, t: torch.Tensor, conditions: Conditions
    ) -> torch.Tensor:
        b, _, h, w = noisy.shape
        image_tokens = (h // 2) * (w // 2)
        text, mask = conditions["text"], conditions["mask"]
        every_image_token = torch.ones(b, image_tokens, device=noisy.device, dtype=torch.bool)
        prediction = model(
            hidden_states=pack(noisy),
            timestep=t,
            encoder_hidden_states=text,
            txt_ids=position_ids(text.shape[1], noisy),
            img_ids=position_ids(image_tokens, noisy),
            attention_mask=torch.cat([mask.bool(), every_image_token], dim=1),
            return_dict=False,
        )[0]
        return unpack(prediction, noisy.shape)

    def next_block_inputs(self, output: object, inputs: tuple) -> tuple:
        # A double block takes (hidden_states, encoder_hidden_states, temb, rotary, mask) and
        # returns (encoder_hidden_states, hidden_states), as FLUX.1's; a single block takes
        # (hidden_states, temb, rotary) and returns the hidden states alone.
        if isinstance(output, torch.Tensor):
            return (output, *inputs[1:])
        return super().next_block_inputs(output, inputs)


WORKLOAD = ChromaWorkload
