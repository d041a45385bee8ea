"""A model whose step is not affine in the batch: a contrastive loss compares every sample with
every other (as CLIP's does), so its similarity matrix holds batch x batch numbers."""

import torch
from torch import nn

from autofit.workloads.custom import CustomModel


def build() -> CustomModel:
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))

    def make_batch(batch_size, resolution, device, dtype):
        tokens = (resolution // 8) ** 2
        return {"x": torch.randn(batch_size, tokens, 64, device=device, dtype=dtype)}

    def loss(model, batch):
        embedded = model(batch["x"]).float().mean(dim=1)
        # a (batch, batch, 64) difference tensor: its bytes grow with the square of the batch
        distances = (embedded[:, None, :] - embedded[None, :, :]).pow(2).sum(-1)
        return distances.mean()

    return CustomModel(model=model, make_batch=make_batch, loss=loss)
