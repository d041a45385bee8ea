"""A two-layer MLP over the tokens of a synthetic image: a model whose every byte can be counted
by hand, for tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autofit.workloads.base import CheckpointFn, Workload


class TokenMLP(nn.Module):
    def __init__(self, in_features: int, hidden_features: int, out_features: int) -> None:
        super().__init__()
        self.hidden = nn.Sequential(nn.Linear(in_features, hidden_features), nn.ReLU())
        self.out = nn.Linear(hidden_features, out_features)
        self.checkpoint: CheckpointFn | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.checkpoint(self.hidden, x) if self.checkpoint else self.hidden(x)
        return self.out(h)


class MLPWorkload(Workload):
    def build_model(self, frozen_dtype: torch.dtype) -> nn.Module:
        return TokenMLP(**self.preset.architecture)

    def _tokens(self, resolution: int) -> int:
        return (resolution // self.preset.inputs["latent_downsample"]) ** 2

    def make_batch(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> dict[str, torch.Tensor]:
        arch, tokens = self.preset.architecture, self._tokens(resolution)
        return {
            "x": torch.randn(batch_size, tokens, arch["in_features"], device=device, dtype=dtype),
            "y": torch.randn(batch_size, tokens, arch["out_features"], device=device, dtype=dtype),
        }

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.mse_loss(model(batch["x"]), batch["y"])

    def enable_checkpointing(self, model: nn.Module, checkpoint: CheckpointFn) -> None:
        model.checkpoint = checkpoint  # type: ignore[assignment]


WORKLOAD = MLPWorkload
