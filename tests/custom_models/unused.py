"""docs/models.md's tiny MLP with a trainable layer the loss never reaches (a head left out of this
objective): its weight gets no gradient, so the optimizer keeps no state for it."""

import dataclasses

from torch import nn

from custom_models import tiny


def build():
    base = tiny.build()
    model = nn.ModuleDict({"body": base.model, "head": nn.Linear(64, 64)})

    def loss(model, batch):
        return model["body"](batch["x"]).float().pow(2).mean()

    return dataclasses.replace(base, model=model, loss=loss)
