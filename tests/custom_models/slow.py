"""A custom model whose every training step takes AUTOFIT_TEST_STEP_S seconds (0.3 by
default), with enough activations per sample (about 0.5 GiB at 1024 px) that an L4 fits a few
dozen samples: a search long enough to stop, kill or cut off from its storage part-way, whose
scans report points besides the largest batch that fits (tests/test_faults.py)."""

import os
import time

import torch
from torch import nn

from autofit.workloads.custom import CustomModel


def build() -> CustomModel:
    model = nn.Sequential(nn.Linear(64, 4096), nn.GELU(), nn.Linear(4096, 64))
    pause = float(os.environ.get("AUTOFIT_TEST_STEP_S", "0.3"))

    def make_batch(batch_size, resolution, device, dtype):
        tokens = (resolution // 8) ** 2
        return {"x": torch.randn(batch_size, tokens, 64, device=device, dtype=dtype)}

    def loss(model, batch):
        time.sleep(pause)
        return model(batch["x"]).float().pow(2).mean()

    def enable_checkpointing(model, checkpoint):
        first, *rest = model
        tail = nn.Sequential(*rest)
        model.forward = lambda x: checkpoint(tail, first(x))

    return CustomModel(
        model=model, make_batch=make_batch, loss=loss, enable_checkpointing=enable_checkpointing
    )
