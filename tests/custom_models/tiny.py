"""docs/models.md's example of a custom model, verbatim: a small MLP over the tokens of an image."""

import torch
from torch import nn

from autofit.workloads.custom import CustomModel


def build() -> CustomModel:
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))

    def make_batch(batch_size, resolution, device, dtype):
        tokens = (resolution // 8) ** 2
        return {"x": torch.randn(batch_size, tokens, 64, device=device, dtype=dtype)}

    def loss(model, batch):
        return model(batch["x"]).float().pow(2).mean()

    return CustomModel(model=model, make_batch=make_batch, loss=loss)


def not_a_model():
    return "a string"
