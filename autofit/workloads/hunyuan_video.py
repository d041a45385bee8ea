"""HunyuanVideo: `HunyuanVideoTransformer3DModel` trained with flow matching on its causal 3-D
VAE's 16-channel latents (4x in time after the first frame, 8x in space, then 1x2x2 patches),
conditioned on LLaVA-Llama-3's prompt embedding (256 tokens x 4096, with its attention mask),
CLIP-L's pooled embedding and the guidance value it is distilled on, as the diffusers pipeline
hands them to it."""

from __future__ import annotations

import torch
from diffusers import HunyuanVideoTransformer3DModel

from autofit.workloads.base import Batch
from autofit.workloads.diffusion import padded_prompts, token_ids, vocab
from autofit.workloads.latent import Conditions
from autofit.workloads.video import VideoDiffusion

# The pipeline's default embedded guidance (guidance_scale=6.0), which it scales by 1000 as it
# scales the timesteps; a value, not a shape: any other holds the same memory.
GUIDANCE = 6.0
# The prompt embedding is the LLM's hidden state this many layers before its last output (the
# pipeline's num_hidden_layers_to_skip=2, as HunyuanVideo's hidden_state_skip_layer).
SKIPPED_LAYERS = 2


class HunyuanVideoWorkload(VideoDiffusion):
    guidance_batch = 1  # guidance-distilled: the pipeline runs no negative prompt by default
    # The pipeline's names: text_encoder the LLM, text_encoder_2 CLIP-L.
    text_encoders = ("text_encoder", "text_encoder_2")

    def build_model(self, frozen_dtype: torch.dtype) -> torch.nn.Module:
        return HunyuanVideoTransformer3DModel(**self.preset.architecture)

    def conditions(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> Conditions:
        inputs = self.preset.inputs
        conditions = self.text_and_pooled(batch_size, inputs["text_tokens"], device, dtype)
        # The cache keeps the prompt's attention mask beside its embedding: the model's token
        # refiner and every block's attention read it.
        conditions["mask"] = torch.ones(
            batch_size, inputs["text_tokens"], device=device, dtype=torch.long
        )
        return conditions

    def tokens(self, batch_size: int, device: torch.device) -> Batch:
        inputs, companions = self.preset.inputs, self.preset.companions
        # The LLM reads the prompt inside its template: the template's tokens, then the prompt's,
        # padded to the tokenizer's max length.
        template, prompt = inputs["template_tokens"], inputs["text_tokens"]
        # A caption shorter than the 256 tokens it is padded to, as nearly every one is: the
        # mask's zeros make transformers build the LLM's 4-D attention mask, as in training
        # (how many zeros changes no shape).
        mask = torch.ones(batch_size, template + prompt, device=device, dtype=torch.long)
        mask[:, template + prompt // 2 :] = 0
        return {
            "text_encoder": token_ids(
                batch_size, template + prompt, vocab(companions["text_encoder"]), device
            ),
            "text_encoder_mask": mask,
            "text_encoder_2": token_ids(
                batch_size, inputs["clip_tokens"], vocab(companions["text_encoder_2"]), device
            ),
        }

    def encode_text(self, tokens: Batch, companions: dict[str, torch.nn.Module]) -> Conditions:
        mask = tokens["text_encoder_mask"]
        with padded_prompts():
            hidden = companions["text_encoder"](
                input_ids=tokens["text_encoder"], attention_mask=mask, output_hidden_states=True
            ).hidden_states[-(SKIPPED_LAYERS + 1)]
        crop = self.preset.inputs["template_tokens"]  # the template's tokens are cropped
        pooled = companions["text_encoder_2"](input_ids=tokens["text_encoder_2"]).pooler_output
        return {"text": hidden[:, crop:], "mask": mask[:, crop:], "pooled": pooled}

    def predict(
        self, model: torch.nn.Module, noisy: torch.Tensor, t: torch.Tensor, conditions: Conditions
    ) -> torch.Tensor:
        b = noisy.shape[0]
        return model(
            hidden_states=noisy,  # 5-D latents: the model patchifies them itself
            timestep=t * 1000,  # the scheduler counts timesteps to 1000
            encoder_hidden_states=conditions["text"],
            encoder_attention_mask=conditions["mask"],
            pooled_projections=conditions["pooled"],
            guidance=torch.full((b,), GUIDANCE * 1000, device=noisy.device, dtype=noisy.dtype),
            return_dict=False,
        )[0]

    def next_block_inputs(self, output: tuple, inputs: tuple) -> tuple:
        # Both of HunyuanVideo's block lists take (hidden_states, encoder_hidden_states, temb,
        # attention_mask, rotary embedding, ...) and return (hidden_states,
        # encoder_hidden_states): Flux's order turned, so the inherited answer would be wrong.
        # (The family declares no checkpoint interval, which is what calls this; should one be
        # declared, its segments hand their blocks their inputs so.)
        hidden_states, encoder_hidden_states = output
        return (hidden_states, encoder_hidden_states, *inputs[2:])


WORKLOAD = HunyuanVideoWorkload
