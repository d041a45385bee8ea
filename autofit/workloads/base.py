"""What a probe trains: a model family's builder, synthetic batch and loss."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from autofit.models import ModelPreset

CheckpointFn = Callable[..., Any]


class Workload:
    """A model family. Subclass it, implement the four methods, export the class as `WORKLOAD`
    from its module, and add the module to `FAMILIES`.

    The model is built with random weights under whatever device and default dtype the caller
    set; the batch is synthetic but shaped exactly as the trainer's would be; the loss is the one
    the family trains with. Nothing is downloaded.

    A family's module imports its model library at the top: importing it later, under fake
    tensors, would turn the library's module-level constant tensors into fake ones.
    """

    def __init__(self, preset: ModelPreset) -> None:
        self.preset = preset

    def build_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def make_batch(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def enable_checkpointing(self, model: torch.nn.Module, checkpoint: CheckpointFn) -> None:
        """Make the model run its blocks through `checkpoint(block, *inputs)`."""
        raise NotImplementedError
