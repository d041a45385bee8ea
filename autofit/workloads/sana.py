"""Sana (NVlabs): `SanaTransformer2DModel` trained with flow matching on DC-AE latents, captions
embedded by Gemma-2."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from diffusers import SanaTransformer2DModel

from autofit.workloads import companions as _companions  # noqa: F401  (imports their libraries now)
from autofit.workloads.base import Batch, CheckpointFn, Workload

if TYPE_CHECKING:
    from autofit.training import TrainingRun


class SanaWorkload(Workload):
    def build_model(self) -> torch.nn.Module:
        return SanaTransformer2DModel(**self.preset.architecture)

    def make_batch(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> Batch:
        inputs = self.preset.inputs
        side = resolution // inputs["latent_downsample"]
        shape = (batch_size, inputs["latent_channels"], side, side)
        return {
            # Precomputed VAE latents and caption embeddings, as Sana's trainer loads them.
            "latents": torch.randn(shape, device=device, dtype=dtype),
            "text": torch.randn(
                batch_size, inputs["text_tokens"], inputs["text_dim"], device=device, dtype=dtype
            ),
            "text_mask": torch.ones(batch_size, inputs["text_tokens"], device=device, dtype=dtype),
        }

    def make_raw_batch(self, batch_size: int, resolution: int, device: torch.device) -> Batch:
        tokens = self.preset.inputs["text_tokens"]
        vocab = self.preset.companions["text_encoder"]["architecture"]["vocab_size"]
        return {
            "images": torch.randn(batch_size, 3, resolution, resolution, device=device),
            "token_ids": torch.randint(0, vocab, (batch_size, tokens), device=device),
            "token_mask": torch.ones(batch_size, tokens, device=device, dtype=torch.long),
        }

    @torch.no_grad()
    def encode(
        self, raw: Batch, companions: dict[str, torch.nn.Module], dtype: torch.dtype
    ) -> Batch:
        text_encoder, vae = companions["text_encoder"], companions["vae"]
        text = text_encoder(
            input_ids=raw["token_ids"], attention_mask=raw["token_mask"]
        ).last_hidden_state
        vae_dtype = next(vae.parameters()).dtype
        latents = vae.encode(raw["images"].to(vae_dtype)).latent * vae.config.scaling_factor
        return {
            "latents": latents.to(dtype),
            "text": text.to(dtype),
            "text_mask": raw["token_mask"].to(dtype),
        }

    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        latents = batch["latents"]
        noise = torch.randn_like(latents)
        # Logit-normal timesteps and the rectified-flow path, as Sana trains.
        t = torch.sigmoid(torch.randn(latents.shape[0], device=latents.device, dtype=latents.dtype))
        t_ = t.view(-1, 1, 1, 1)
        noisy = (1 - t_) * latents + t_ * noise
        pred: Any = model(
            noisy,
            encoder_hidden_states=batch["text"],
            timestep=t * 1000,
            encoder_attention_mask=batch["text_mask"],
            return_dict=False,
        )[0]
        return F.mse_loss(pred.float(), (noise - latents).float())

    def enable_checkpointing(self, model: torch.nn.Module, checkpoint: CheckpointFn) -> None:
        model.enable_gradient_checkpointing(checkpoint)  # type: ignore[operator]

    @torch.no_grad()
    def validate(self, run: TrainingRun, vae: torch.nn.Module) -> None:
        # SanaPipeline's denoiser step with classifier-free guidance (the prompt and the negative
        # prompt as a batch of two; their embeddings cached, or encoded when the text encoder is
        # resident), then the VAE decode at the training resolution.
        inputs, resolution = self.preset.inputs, run.knobs["resolution"]
        side = resolution // inputs["latent_downsample"]
        latents = torch.randn(
            1, inputs["latent_channels"], side, side, device=run.device, dtype=run.param_dtype
        )
        text_encoder = run.companions.get("text_encoder")
        if text_encoder is not None:
            raw = self.make_raw_batch(2, resolution, run.device)
            prompts = text_encoder(
                input_ids=raw["token_ids"], attention_mask=raw["token_mask"]
            ).last_hidden_state
        else:
            prompts = torch.randn(
                2,
                inputs["text_tokens"],
                inputs["text_dim"],
                device=run.device,
                dtype=run.param_dtype,
            )
        mask = torch.ones(2, inputs["text_tokens"], device=run.device, dtype=run.param_dtype)
        timestep = torch.full((2,), 999.0, device=run.device, dtype=run.param_dtype)
        prediction = run.model(torch.cat([latents] * 2), encoder_hidden_states=prompts.to(run.param_dtype),
                               encoder_attention_mask=mask, timestep=timestep, return_dict=False)[0].float()  # fmt: skip
        uncond, cond = prediction.chunk(2)
        latents = latents - 0.02 * (uncond + 4.5 * (cond - uncond))  # one flow-matching Euler step
        vae_dtype = next(vae.parameters()).dtype
        vae.decode(latents.to(vae_dtype) / vae.config.scaling_factor, return_dict=False)


WORKLOAD = SanaWorkload
