"""An SD3 ControlNet trained against a frozen SD3 transformer, as diffusers' ControlNet SD3 example
trains it: the ControlNet (a copy of the transformer's first blocks, trainable) reads the noisy
latents and the conditioning image's latents, and its residuals join the frozen transformer's
blocks; gradients flow back through the transformer's activations, not into its weights.

The training loop is the example's: gradients are zeroed in place and stay allocated between steps
(its `--set_grads_to_none` is off by default), and the three text encoders and the VAE stay on the
GPU in the weight dtype throughout: it precomputes the text embeddings, then `del`s the encoders'
names, but the list it encoded with (`text_encoders`, also bound in `compute_embeddings_fn`) keeps
them alive; the VAE stays to encode latents every step.

Its validation is the example's `log_validation` as diffusers issue #11225 ran it (before the fix
of 2025-04-09, fd02aad): the example loads a fresh `StableDiffusion3ControlNetPipeline` in
`weight_dtype` and moves it to the device, which puts a second copy of the transformer, all three
text encoders and a VAE, in the weight dtype (fp32 unless mixed precision is on), onto the GPU beside the training
state, steered by the ControlNet being trained; the prompt is encoded inside the pipeline call
(T5 at the pipeline's 256 tokens), under `torch.autocast(device)`, whose cast cache keeps a
16-bit copy of every fp32 weight it casts until the call returns. Together they run an A100
80GB out of memory where training alone fits. With `validation=offload`, the fix users apply, the
pipeline steers the frozen transformer training holds and keeps its own text encoders and VAE in
host memory, each moved to the GPU only while it runs (enable_model_cpu_offload).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from diffusers import SD3ControlNetModel, SD3Transformer2DModel
from torch import nn

from autofit.knobs.validation_resolution import validation_pixels
from autofit.run_state import default_dtype
from autofit.workloads.base import Batch, CheckpointFn
from autofit.workloads.companions import build_companion  # now: before any fake mode
from autofit.workloads.latent import Conditions, vae_decode, vae_encode
from autofit.workloads.sd3 import SD3Workload

if TYPE_CHECKING:
    from autofit.run_state import RunState
    from autofit.workloads.pipeline import Pipeline


class ControlNetTraining(nn.Module):
    """The trainable ControlNet and the frozen transformer it steers, as one module."""

    def __init__(self, controlnet: nn.Module, transformer: nn.Module) -> None:
        super().__init__()
        self.controlnet = controlnet
        self.transformer = transformer


def pipeline_text_encoders(
    workload: Any, pipeline: Pipeline, dtype: torch.dtype
) -> dict[str, nn.Module]:
    """The text encoders a validation pipeline loads itself, in `dtype` (a ControlNet example's
    pipeline, from_pretrained in the weight dtype, whatever training holds)."""
    companions = workload.preset.companions
    return {
        name: pipeline.load(lambda name=name: build_companion(companions[name], dtype))
        for name in workload.text_encoders
    }


# The pipeline's defaults in the example's validation call.
PIPELINE_T5_TOKENS = 256  # max_sequence_length
GUIDANCE_SCALE = 7.0


class ControlImages:
    """A ControlNet workload's raw batch: a conditioning image beside each training image."""

    def make_raw_batch(self, batch_size: int, resolution: int, device: torch.device) -> Batch:
        raw = super().make_raw_batch(batch_size, resolution, device)  # type: ignore[misc]
        raw["control_images"] = torch.randn_like(raw["images"])
        return raw


class SD3ControlNetWorkload(ControlImages, SD3Workload):
    grads_set_to_none = False  # the example's --set_grads_to_none is off by default
    resident_when_cached = ("text_encoder", "text_encoder_2", "text_encoder_3", "vae")

    def build_model(self, frozen_dtype: torch.dtype) -> nn.Module:
        transformer_config = self.preset.architecture["transformer"]
        with default_dtype(frozen_dtype):  # the frozen base in the 16-bit weight dtype
            transformer = SD3Transformer2DModel(**transformer_config).requires_grad_(False)
        controlnet = SD3ControlNetModel(
            **{**transformer_config, **self.preset.architecture["controlnet"]}
        )
        return ControlNetTraining(controlnet, transformer)

    def conditions(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> Conditions:
        control = torch.randn(self.latent_shape(batch_size, resolution), device=device, dtype=dtype)
        return {**super().conditions(batch_size, resolution, device, dtype), "control": control}

    @torch.no_grad()
    def encode(self, raw: Batch, companions: dict[str, nn.Module], dtype: torch.dtype) -> Batch:
        batch = super().encode(raw, companions, dtype)
        batch["control"] = vae_encode(companions["vae"], raw["control_images"]).to(dtype)
        return batch

    def predict(
        self, model: nn.Module, noisy: torch.Tensor, t: torch.Tensor, conditions: Conditions
    ) -> torch.Tensor:
        common = {
            "hidden_states": noisy,
            "encoder_hidden_states": conditions["text"],
            "pooled_projections": conditions["pooled"],
            "timestep": t * 1000,
            "return_dict": False,
        }
        residuals = model.controlnet(controlnet_cond=conditions["control"], **common)[0]
        return model.transformer(block_controlnet_hidden_states=residuals, **common)[0]

    def enable_checkpointing(self, model: nn.Module, checkpoint: CheckpointFn) -> None:
        model.controlnet.enable_gradient_checkpointing(checkpoint)  # type: ignore[operator]

    @torch.no_grad()
    def validate(self, run: RunState, pipeline: Pipeline) -> None:
        # The pipeline loads its own text encoders and VAE (so the training loop's, in
        # `pipeline.components`, go unused), and, moved to the GPU whole, its own transformer;
        # offloaded, it is given the frozen transformer training holds. Weights keep
        # requires_grad, as a freshly loaded pipeline leaves them: autocast caches the cast
        # copies of such weights until the call returns, offloaded or not.
        dtype, device = run.dtypes.frozen, run.device
        resolution = validation_pixels(run.knobs, run.preset.resolution)
        companions = self.preset.companions
        if pipeline.offload:
            transformer = run.model.transformer
        else:
            transformer = pipeline.load(lambda: self._transformer(dtype))
        encoders = pipeline_text_encoders(self, pipeline, dtype)
        pipeline_vae = pipeline.load(lambda: build_companion(companions["vae"], dtype))
        steered = ControlNetTraining(run.model.controlnet, transformer)
        height, width = self.preset.shape(resolution)
        with torch.autocast(device.type, dtype=torch.float16):  # the example's inference_ctx
            # the prompt and the negative prompt, encoded by the pipeline
            tokens = self.tokens(2, device, t5_tokens=PIPELINE_T5_TOKENS)
            conditions = self.encode_text(tokens, encoders)
            control_image = torch.randn(1, 3, height, width, device=device, dtype=dtype)
            control = vae_encode(pipeline_vae, control_image)
            latents = torch.randn(self.latent_shape(1, resolution), device=device, dtype=dtype)
            conditions["control"] = torch.cat([control] * 2)
            t = torch.full((2,), 1.0, device=device, dtype=dtype)
            prediction = self.predict(steered, torch.cat([latents] * 2), t, conditions)
            uncond, cond = prediction.chunk(2)
            guided = uncond + GUIDANCE_SCALE * (cond - uncond)
            vae_decode(pipeline_vae, (latents - 0.05 * guided).to(dtype))

    def _transformer(self, dtype: torch.dtype) -> nn.Module:
        with default_dtype(dtype):
            return SD3Transformer2DModel(**self.preset.architecture["transformer"])


WORKLOAD = SD3ControlNetWorkload
