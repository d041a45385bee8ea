"""Qwen-Image: `QwenImageTransformer2DModel` trained with flow matching on its VAE's 16-channel
latents packed into 2x2 patches (64 channels a token), conditioned on Qwen2.5-VL's last hidden
state over the pipeline's chat template (its leading tokens dropped) with the prompt's mask, as
`QwenImagePipeline` and diffusers' train_dreambooth_lora_qwen_image.py hand them to it.

Its VAE is Wan 2.1's causal 3-D layout run on single frames: images go in as one-frame clips and
their latents come out with one latent frame, scaled per channel, which the trainers pack
without it (the batch holds them as images' (B, C, H, W) latents: the same bytes).

Qwen-Image-Edit is the same model trained on pairs: the reference image's latents follow the
target's tokens, each image with its own entry in `img_shapes`, and the prediction over them is
cut off before the loss (QwenImageEditPipeline, diffusers 0.42; musubi-tuner's
qwen_image_train_network.py call_dit with --model_version edit; SimpleTuner's edit-v1). Its text
encoder reads the reference too: the edit template places the image's vision tokens
(`inputs.vision_tokens`, with their start and end markers) after the dropped system prompt, so
the prompt embedding the transformer attends to holds them before the caption.

Known limitation: with the text encoder online, its language model runs over the vision tokens'
positions (as token ids), but the vision tower's own pass over the reference's patches, without
gradients, is not run: its index computations (grid sizes, window order, rotary positions) read
tensor values fake tensors lack. Its weights are resident all the same (the whole Qwen2.5-VL is
built); its transient activations are left out.
"""

from __future__ import annotations

import torch
from diffusers import QwenImageTransformer2DModel

from autofit.workloads.base import Batch
from autofit.workloads.diffusion import pack, padded_prompts, token_ids, unpack
from autofit.workloads.latent import Conditions, LatentDiffusion, channel_stats


class QwenImageWorkload(LatentDiffusion):
    # Not guidance-distilled, but QwenImagePipeline runs a negative prompt's pass (true CFG) after
    # the prompt's, each of one sample, and the diffusers script's validation gives none: the
    # denoiser never runs two samples at once.
    guidance_batch = 1
    text_encoders = ("text_encoder",)

    def build_model(self, frozen_dtype: torch.dtype) -> torch.nn.Module:
        return QwenImageTransformer2DModel(**self.preset.architecture)

    def conditions(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> Conditions:
        inputs = self.preset.inputs
        shape = (batch_size, self.prompt_tokens)
        return {
            "text": torch.randn(*shape, inputs["text_dim"], device=device, dtype=dtype),
            # The prompt's mask beside its embedding, as the pipeline's encode_prompt returns it
            # and the diffusers script hands it to every block's joint attention.
            "mask": torch.ones(shape, device=device, dtype=torch.long),
        }

    @property
    def prompt_tokens(self) -> int:
        """The prompt embedding's tokens once the template's leading ones are dropped: an edit
        model's vision tokens of its reference, then the caption and the template's closing ones."""
        inputs = self.preset.inputs
        return int(inputs.get("vision_tokens", 0)) + int(inputs["text_tokens"])

    def tokens(self, batch_size: int, device: torch.device) -> Batch:
        inputs = self.preset.inputs
        # The template's leading tokens, then the caption and the template's closing ones,
        # padded to the batch's longest caption: a shorter caption's zeros make transformers
        # build the LLM's 4-D attention mask, as in training (how many zeros changes no shape).
        template, prompt = inputs["template_tokens"], self.prompt_tokens
        mask = torch.ones(batch_size, template + prompt, device=device, dtype=torch.long)
        mask[:, template + prompt // 2 :] = 0
        # Qwen2.5-VL's vocabulary is its language model's (text_config)
        size = int(
            self.preset.companions["text_encoder"]["architecture"]["text_config"]["vocab_size"]
        )
        return {
            "text_encoder": token_ids(batch_size, template + prompt, size, device),
            "text_encoder_mask": mask,
        }

    def encode_text(self, tokens: Batch, companions: dict[str, torch.nn.Module]) -> Conditions:
        mask = tokens["text_encoder_mask"]
        with padded_prompts():
            hidden = companions["text_encoder"](
                input_ids=tokens["text_encoder"], attention_mask=mask, output_hidden_states=True
            ).hidden_states[-1]
        # The pipeline drops the template's leading tokens (prompt_template_encode_start_idx);
        # it gathers each prompt's unmasked tokens and pads them again, a copy of this size that
        # a slice leaves out (its count depends on the mask's values, which fake tensors lack).
        drop = self.preset.inputs["template_tokens"]
        return {"text": hidden[:, drop:], "mask": mask[:, drop:]}

    def predict(
        self, model: torch.nn.Module, noisy: torch.Tensor, t: torch.Tensor, conditions: Conditions
    ) -> torch.Tensor:
        b, _, h, w = noisy.shape
        image = pack(noisy)
        target_tokens = image.shape[1]
        shapes = [(1, h // 2, w // 2)]  # one frame of h/2 x w/2 patches each
        if "references" in conditions:  # an edit model: the reference's tokens after the target's
            references = conditions["references"]
            image = torch.cat([image, self.reference_tokens(references)], dim=1)
            rh, rw = references.shape[-2:]
            shapes += [(1, rh // 2, rw // 2)] * references.shape[1]
        prediction = model(
            hidden_states=image,
            timestep=t,  # the sigma in [0, 1]: the trainers pass timesteps / 1000
            encoder_hidden_states=conditions["text"],
            encoder_hidden_states_mask=conditions["mask"],
            img_shapes=[shapes] * b,
            return_dict=False,
        )[0]
        return unpack(prediction[:, :target_tokens], noisy.shape)

    def encode_latents(self, vae: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
        dtype = next(vae.parameters()).dtype
        latents = vae.encode(images.unsqueeze(2).to(dtype)).latent_dist.sample()
        mean, std = channel_stats(vae, latents)
        return ((latents - mean) / std).squeeze(2)

    def decode_latents(self, vae: torch.nn.Module, latents: torch.Tensor) -> torch.Tensor:
        dtype = next(vae.parameters()).dtype
        clip = latents.unsqueeze(2)
        mean, std = channel_stats(vae, clip)
        return vae.decode((clip * std + mean).to(dtype), return_dict=False)[0][:, :, 0]


WORKLOAD = QwenImageWorkload
