"""An SDXL ControlNet trained against a frozen SDXL UNet, as diffusers' ControlNet SDXL example
(examples/controlnet/train_controlnet_sdxl.py) trains it: the ControlNet
(`ControlNetModel.from_unet`: the UNet's encoder half, trainable, in fp32) reads the noisy
latents and the conditioning image itself, in pixels, through its small convolutional embedding;
its residuals join the frozen UNet's down and middle blocks, so gradients flow back through the
UNet's activations, not into its weights.

The training loop is the example's: gradients are zeroed in place and stay allocated between
steps (`--set_grads_to_none` is off by default); both text encoders sit on the GPU in the weight
dtype throughout (it precomputes the embeddings, but `text_encoder_one` and `text_encoder_two`,
and the list its embedding function was bound to, keep them alive), and the VAE, in fp32 unless
`--pretrained_vae_model_name_or_path` names another, encodes each batch's images every step.
With checkpointing on, the example checkpoints the ControlNet's blocks and the UNet's.

Its validation (`log_validation`) builds a `StableDiffusionXLControlNetPipeline` around the
training's VAE, UNet and ControlNet, loading a second pair of text encoders in the weight dtype,
and moves it to the GPU; the prompt and its negative run through the UNet together under
`torch.autocast`, with the validation image as the condition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from diffusers import ControlNetModel
from torch import nn

from autofit.knobs.validation_resolution import validation_pixels
from autofit.run_state import default_dtype
from autofit.workloads.base import Batch, CheckpointFn
from autofit.workloads.latent import Conditions, vae_decode
from autofit.workloads.sd3_controlnet import (
    ControlImages,
    ControlNetTraining,
    pipeline_text_encoders,
)
from autofit.workloads.sdxl import SDXLWorkload
from autofit.workloads.unet import STEPS

if TYPE_CHECKING:
    from autofit.run_state import RunState
    from autofit.workloads.pipeline import Pipeline

GUIDANCE_SCALE = 5.0  # StableDiffusionXLControlNetPipeline's default


class SDXLControlNetWorkload(ControlImages, SDXLWorkload):
    grads_set_to_none = False  # the example's --set_grads_to_none is off by default
    # the encoders it keeps referenced; the VAE is there to encode latents, which a cached run
    # has (and in fp32, not the weight dtype these are kept in)
    resident_when_cached = ("text_encoder", "text_encoder_2")

    def build_model(self, frozen_dtype: torch.dtype) -> nn.Module:
        with default_dtype(frozen_dtype):  # the frozen UNet in the 16-bit weight dtype
            unet = self.unet().requires_grad_(False)
        # The example's ControlNetModel.from_unet: the UNet's configuration and encoder weights,
        # in the default (fp32) dtype it is trained in.
        return ControlNetTraining(ControlNetModel.from_unet(unet), unet)

    def conditions(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> Conditions:
        height, width = self.preset.shape(resolution)
        control = torch.randn(batch_size, 3, height, width, device=device, dtype=dtype)
        return {**super().conditions(batch_size, resolution, device, dtype), "control": control}

    @torch.no_grad()
    def encode(self, raw: Batch, companions: dict[str, nn.Module], dtype: torch.dtype) -> Batch:
        batch = super().encode(raw, companions, dtype)
        batch["control"] = raw["control_images"].to(dtype)  # the ControlNet reads pixels
        return batch

    def predict(
        self, model: nn.Module, noisy: torch.Tensor, t: torch.Tensor, conditions: Conditions
    ) -> torch.Tensor:
        steps = (t * (STEPS - 1)).long()
        added = {"text_embeds": conditions["pooled"], "time_ids": conditions["time_ids"]}
        down, mid = model.controlnet(
            noisy,
            steps,
            encoder_hidden_states=conditions["text"],
            added_cond_kwargs=added,
            controlnet_cond=conditions["control"],
            return_dict=False,
        )
        dtype = noisy.dtype
        return model.transformer(
            noisy,
            steps,
            encoder_hidden_states=conditions["text"],
            added_cond_kwargs=added,
            down_block_additional_residuals=[sample.to(dtype) for sample in down],
            mid_block_additional_residual=mid.to(dtype),
            return_dict=False,
        )[0]

    def enable_checkpointing(self, model: nn.Module, checkpoint: CheckpointFn) -> None:
        model.controlnet.enable_gradient_checkpointing(checkpoint)  # type: ignore[operator]
        model.transformer.enable_gradient_checkpointing(checkpoint)  # type: ignore[operator]

    @torch.no_grad()
    def validate(self, run: RunState, pipeline: Pipeline) -> None:
        # The pipeline steers the training's UNet with the ControlNet being trained and decodes
        # with the training's VAE; it loads its own pair of text encoders.
        dtype, device = run.dtypes.frozen, run.device
        resolution = validation_pixels(run.knobs, run.preset.resolution)
        encoders = pipeline_text_encoders(self, pipeline, dtype)
        height, width = self.preset.shape(resolution)
        with torch.autocast(device.type, dtype=torch.float16):  # the example's autocast_ctx
            conditions = self.encode_text(self.tokens(2, device), encoders)
            conditions["control"] = torch.randn(2, 3, height, width, device=device, dtype=dtype)
            latents = torch.randn(self.latent_shape(1, resolution), device=device, dtype=dtype)
            t = torch.full((2,), 0.5, device=device, dtype=dtype)
            prediction = self.predict(run.model, torch.cat([latents] * 2), t, conditions)
            uncond, cond = prediction.chunk(2)
            guided = uncond + GUIDANCE_SCALE * (cond - uncond)
            vae_decode(run.companions["vae"], (latents - 0.05 * guided).float())


WORKLOAD = SDXLControlNetWorkload
