"""Latent diffusion families: a denoiser trained on VAE latents, conditioned on text embeddings.

`LatentDiffusion` holds what Sana, PixArt, SD3, Flux, SDXL and the SD3 ControlNet share: the batch
(cached latents and embeddings, or images and token ids for the encoders to run on), the training
objective, and the validation pass (the pipeline's denoiser step with guidance, then the decode).
A family says how it builds its model, what its text conditioning is and how its encoders make
it, and how its denoiser is called; `CaptionDiffusion` says the conditioning of those with one
text encoder whose caption embedding and mask the denoiser takes (Sana, PixArt).

An image-editing preset (`inputs.num_reference_images`: FLUX.1 Kontext, Qwen-Image-Edit) trains
on pairs: beside the target's latents, the latents of its reference images, each the target's
size (the trainers resize a reference to its target's bucket by default), which the denoiser
reads as tokens appended to the target's (`reference_tokens`); the loss is on the target's alone.
Cached, they are loaded beside the target's latents; online, the VAE encodes them as well; a
validation image encodes one reference with the pipeline's VAE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from autofit.knobs.validation_resolution import validation_pixels
from autofit.workloads.base import Batch, CheckpointFn, Workload
from autofit.workloads.diffusion import flow_matching, pack, token_ids, vocab

if TYPE_CHECKING:
    from autofit.run_state import RunState
    from autofit.workloads.pipeline import Pipeline

Conditions = dict[str, torch.Tensor]


class LatentDiffusion(Workload):
    # Samples the validation pass denoises at once: 2 with classifier-free guidance (the prompt
    # and the negative prompt), 1 for a guidance-distilled model.
    guidance_batch = 2
    text_encoders: tuple[str, ...] = ("text_encoder",)

    # -- what a family provides ----------------------------------------------------------------

    def conditions(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> Conditions:
        """Cached text conditioning, as a trainer loads it from its cache."""
        raise NotImplementedError

    def text_and_pooled(
        self, batch_size: int, text_tokens: int, device: torch.device, dtype: torch.dtype
    ) -> Conditions:
        """Per-token text embeddings and a pooled one, as the MMDiT, Flux and SDXL caches hold."""
        inputs = self.preset.inputs
        return {
            "text": torch.randn(
                batch_size, text_tokens, inputs["text_dim"], device=device, dtype=dtype
            ),
            "pooled": torch.randn(batch_size, inputs["pooled_dim"], device=device, dtype=dtype),
        }

    def tokens(self, batch_size: int, device: torch.device) -> Batch:
        """Token ids for each text encoder."""
        raise NotImplementedError

    def encode_text(self, tokens: Batch, companions: dict[str, torch.nn.Module]) -> Conditions:
        raise NotImplementedError

    def predict(
        self, model: torch.nn.Module, noisy: torch.Tensor, t: torch.Tensor, conditions: Conditions
    ) -> torch.Tensor:
        """The denoiser's output for noisy latents at timesteps t in [0, 1]."""
        raise NotImplementedError

    def noising(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Noisy latents, the target the prediction is compared with, and the timesteps."""
        return flow_matching(latents)

    # -- shared ----------------------------------------------------------------------------------

    @property
    def references(self) -> int:
        """The reference images an editing model reads beside each target (0: none)."""
        return int(self.preset.inputs.get("num_reference_images", 0))

    def reference_tokens(self, references: torch.Tensor) -> torch.Tensor:
        """(B, n, C, H, W) reference latents as the tokens appended to the target's: each packed
        into 2x2 patches as the target is, the n images one after another."""
        b, n = references.shape[:2]
        tokens = pack(references.flatten(0, 1))
        return tokens.view(b, n * tokens.shape[1], tokens.shape[2])

    def _encode_references(self, vae: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
        b, n = images.shape[:2]
        latents = self.encode_latents(vae, images.flatten(0, 1))
        return latents.view(b, n, *latents.shape[1:])

    def latent_shape(self, batch_size: int, resolution: int) -> tuple[int, int, int, int]:
        inputs = self.preset.inputs
        height, width = self.preset.shape(resolution)
        down = inputs["latent_downsample"]
        return batch_size, inputs["latent_channels"], height // down, width // down

    def make_batch(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> Batch:
        shape = self.latent_shape(batch_size, resolution)
        latents = torch.randn(shape, device=device, dtype=dtype)
        batch = {"latents": latents, **self.conditions(batch_size, resolution, device, dtype)}
        if self.references:  # cached beside the target's, as the trainers cache them
            references = (shape[0], self.references, *shape[1:])
            batch["references"] = torch.randn(references, device=device, dtype=dtype)
        return batch

    def make_raw_batch(self, batch_size: int, resolution: int, device: torch.device) -> Batch:
        height, width = self.preset.shape(resolution)
        raw = {
            "images": torch.randn(batch_size, 3, height, width, device=device),
            "tokens": self.tokens(batch_size, device),
        }
        if self.references:
            shape = (batch_size, self.references, 3, height, width)
            raw["references"] = torch.randn(shape, device=device)
        return raw

    @torch.no_grad()
    def encode(
        self, raw: Batch, companions: dict[str, torch.nn.Module], dtype: torch.dtype
    ) -> Batch:
        latents = self.encode_latents(companions["vae"], raw["images"])
        conditions = self.encode_text(raw["tokens"], companions)
        if self.references:
            conditions["references"] = self._encode_references(companions["vae"], raw["references"])
        return {
            "latents": latents.to(dtype),
            **{k: v.to(dtype) if v.is_floating_point() else v for k, v in conditions.items()},
        }

    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        noisy, target, t = self.noising(batch["latents"])
        conditions = {k: v for k, v in batch.items() if k != "latents"}
        prediction = self.predict(model, noisy, t, conditions)
        return F.mse_loss(prediction.float(), target.float())

    def enable_checkpointing(self, model: torch.nn.Module, checkpoint: CheckpointFn) -> None:
        model.enable_gradient_checkpointing(checkpoint)  # type: ignore[operator]

    def next_block_inputs(self, output: Any, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        # diffusers' joint blocks (SD3's, and both of Flux's lists) take (hidden_states,
        # encoder_hidden_states, temb, ...) and return (encoder_hidden_states, hidden_states).
        encoder_hidden_states, hidden_states = output
        return (hidden_states, encoder_hidden_states, *inputs[2:])

    @torch.no_grad()
    def validate(self, run: RunState, pipeline: Pipeline) -> None:
        # The pipeline encodes the prompt (with its guidance batch), runs the denoiser step at
        # the validation resolution, one Euler step, and decodes with the VAE.
        g, device, dtype, resolution = (
            self.guidance_batch,
            run.device,
            run.dtypes.weights,
            validation_pixels(run.knobs, run.preset.resolution),
        )
        latents = torch.randn(self.latent_shape(1, resolution), device=device, dtype=dtype)
        conditions = self.conditions(g, resolution, device, dtype)
        encoded = self.encode_text(self.tokens(g, device), pipeline.components)
        conditions.update(
            {k: v.to(dtype) if v.is_floating_point() else v for k, v in encoded.items()}
        )
        if self.references:  # the pipeline encodes the reference images with its VAE
            height, width = self.preset.shape(resolution)
            images = torch.randn(g, self.references, 3, height, width, device=device)
            references = self._encode_references(pipeline.components["vae"], images)
            conditions["references"] = references.to(dtype)
        t = torch.full((g,), 1.0, device=device, dtype=dtype)
        prediction = self.predict(run.model, torch.cat([latents] * g), t, conditions).float()
        if g == 2:
            uncond, cond = prediction.chunk(2)
            prediction = uncond + 4.5 * (cond - uncond)
        self.decode_latents(pipeline.components["vae"], latents - 0.02 * prediction)

    def encode_latents(self, vae: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
        """Images to the latents the denoiser trains on, as the family's VAE scales them."""
        return vae_encode(vae, images)

    def decode_latents(self, vae: torch.nn.Module, latents: torch.Tensor) -> torch.Tensor:
        return vae_decode(vae, latents)


class CaptionDiffusion(LatentDiffusion):
    """A denoiser conditioned on one text encoder's per-token caption embedding and its attention
    mask (Sana's Gemma-2, PixArt's T5), padded to the preset's `text_tokens`."""

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
        # Their blocks (SanaTransformerBlock, BasicTransformerBlock) return the hidden states
        # alone; the rest of their inputs (the masks, the captions, the timestep embedding, the
        # patch grid) are the same for every block.
        return (output, *inputs[1:])


def _vae_dtype(vae: torch.nn.Module) -> torch.dtype:
    return next(vae.parameters()).dtype


def vae_encode(vae: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    """Images to scaled latents, for either kind of VAE (DC-AE or AutoencoderKL)."""
    out: Any = vae.encode(images.to(_vae_dtype(vae)))
    latents = out.latent if hasattr(out, "latent") else out.latent_dist.sample()
    shift = getattr(vae.config, "shift_factor", None) or 0.0
    return (latents - shift) * vae.config.scaling_factor


def vae_decode(vae: torch.nn.Module, latents: torch.Tensor) -> torch.Tensor:
    shift = getattr(vae.config, "shift_factor", None) or 0.0
    return vae.decode(
        latents.to(_vae_dtype(vae)) / vae.config.scaling_factor + shift, return_dict=False
    )[0]


def channel_stats(vae: torch.nn.Module, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-channel latent mean and standard deviation a Wan-layout VAE's (B, C, T, H, W)
    latents are scaled by (Wan's, Qwen-Image's: `latents_mean`, `latents_std` in its config)."""
    shape = (1, -1, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean, device=like.device, dtype=like.dtype)
    std = torch.tensor(vae.config.latents_std, device=like.device, dtype=like.dtype)
    return mean.view(shape), std.view(shape)
