"""FLUX.1: `FluxTransformer2DModel` trained with flow matching on 16-channel VAE latents packed
into 2x2 patches, conditioned on T5-XXL (the preset's `t5_tokens`) and CLIP-L's pooled embedding,
with the guidance value FLUX.1 [dev] is distilled on where the model embeds one
(`guidance_embeds`; FLUX.1 [schnell] has none).

FLUX.1 Kontext [dev] is FLUX.1 [dev]'s model trained on pairs: its reference image's latents,
packed as the target's, follow the target's tokens in the image stream with their own position
ids, and the prediction over them is cut off before the loss (FluxKontextPipeline, diffusers
0.42; train_dreambooth_lora_flux_kontext.py; musubi-tuner's flux_kontext_train_network.py
call_dit), so the blocks' image sequence is twice the target's at equal size."""

from __future__ import annotations

import torch
from diffusers import FluxTransformer2DModel

from autofit.workloads.base import Batch
from autofit.workloads.diffusion import pack, token_ids, unpack, vocab
from autofit.workloads.latent import Conditions, LatentDiffusion

GUIDANCE = 3.5


def position_ids(count: int, like: torch.Tensor) -> torch.Tensor:
    """Rotary position ids (count, 3) for a run of tokens; their values change no shape."""
    return torch.zeros(count, 3, device=like.device, dtype=like.dtype)


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
        b = noisy.shape[0]
        guidance = None  # FLUX.1 [schnell] embeds no guidance (and its model takes none)
        if self.preset.architecture.get("guidance_embeds", False):
            guidance = torch.full((b,), GUIDANCE, device=noisy.device, dtype=noisy.dtype)
        image = pack(noisy)
        target_tokens = image.shape[1]
        if "references" in conditions:  # Kontext: the reference's tokens after the target's
            image = torch.cat([image, self.reference_tokens(conditions["references"])], dim=1)
        prediction = model(
            hidden_states=image,
            timestep=t,
            guidance=guidance,
            pooled_projections=conditions["pooled"],
            encoder_hidden_states=conditions["text"],
            txt_ids=position_ids(conditions["text"].shape[1], noisy),
            img_ids=position_ids(image.shape[1], noisy),
            return_dict=False,
        )[0]
        return unpack(prediction[:, :target_tokens], noisy.shape)


WORKLOAD = FluxWorkload
