"""Video latent diffusion: a denoiser trained on a causal 3-D VAE's latents of short clips.

`VideoDiffusion` is `LatentDiffusion` with time: a sample is a clip of `frames` frames (the
frames knob; the preset's native length when unset), each at the resolution's bucket, which the
VAE encodes to 1 + (frames - 1) / temporal_downsample latent frames of the image families'
spatial size. A validation pass denoises and decodes one clip of that length.
"""

from __future__ import annotations

import torch

from autofit.knobs.frames import latent_frames, native_frames
from autofit.models import ModelPreset
from autofit.workloads.base import Batch
from autofit.workloads.latent import LatentDiffusion


class VideoDiffusion(LatentDiffusion):
    def __init__(self, preset: ModelPreset, frames: int | None = None) -> None:
        super().__init__(preset, native_frames(preset) if frames is None else frames)

    def latent_shape(self, batch_size: int, resolution: int) -> tuple[int, ...]:
        b, channels, height, width = super().latent_shape(batch_size, resolution)
        return b, channels, latent_frames(self.frames, self.preset), height, width

    def make_raw_batch(self, batch_size: int, resolution: int, device: torch.device) -> Batch:
        height, width = self.preset.shape(resolution)
        return {
            "images": torch.randn(batch_size, 3, self.frames, height, width, device=device),
            "tokens": self.tokens(batch_size, device),
        }
