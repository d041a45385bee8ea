"""A model whose step is not affine in the batch: docs/models.md's tiny MLP (custom_models.tiny)
trained with a contrastive loss that compares every sample with every other (as CLIP's does), so
its difference tensor holds batch x batch x 64 numbers."""

import dataclasses

from autofit.workloads.custom import CustomModel
from custom_models import tiny


def build() -> CustomModel:
    def loss(model, batch):
        embedded = model(batch["x"]).float().mean(dim=1)
        distances = (embedded[:, None, :] - embedded[None, :, :]).pow(2).sum(-1)
        return distances.mean()

    return dataclasses.replace(tiny.build(), loss=loss)
