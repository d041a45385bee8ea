"""What a probe trains: a model family's builder, synthetic batch and loss."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from autofit.models import ModelPreset
    from autofit.run_state import RunState
    from autofit.workloads.pipeline import Pipeline

CheckpointFn = Callable[..., Any]
Batch = dict[str, Any]


@contextmanager
def replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name` is `value` inside, and what it was after: a library's check that reads
    tensor values (which fake tensors lack) answered as the probe's batch makes it answer, on
    every backend alike."""
    own = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, own)


class Workload:
    """A model family. Subclass it, implement what the family supports, export the class as
    `WORKLOAD` from its module, and name the module in the family's declaration
    (autofit/families/).

    The model is built with random weights under whatever device and default dtype the caller
    set; the batch is synthetic but shaped exactly as the trainer's would be; the loss is the one
    the family trains with. Nothing is downloaded.

    A family's module imports its model library at the top: importing it later, under fake
    tensors, would turn the library's module-level constant tensors into fake ones.
    """

    # How the trainer clears gradients after each update: freed (`zero_grad(set_to_none=True)`,
    # PyTorch's default), or zeroed in place and kept allocated between steps.
    grads_set_to_none = True
    # Companions the trainer leaves on the GPU, in the weight dtype, although it trains from
    # cached embeddings (a script that precomputes them but keeps its encoders referenced).
    resident_when_cached: tuple[str, ...] = ()
    # The companions that encode the prompt (a validation pipeline loads them to encode its own).
    text_encoders: tuple[str, ...] = ()

    def __init__(self, preset: ModelPreset, frames: int | None = None) -> None:
        # `frames`: a video family's clip length (the frames knob; None: the preset's native
        # one); an image or language family has none.
        self.preset = preset
        self.frames = frames

    def build_model(self, frozen_dtype: torch.dtype) -> torch.nn.Module:
        """The model, with random weights; a part that stays frozen is built in `frozen_dtype`
        (the 16-bit weight dtype under mixed precision)."""
        raise NotImplementedError

    def make_batch(
        self, batch_size: int, resolution: int, device: torch.device, dtype: torch.dtype
    ) -> Batch:
        """The batch as a trainer with cached latents and text embeddings loads it."""
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        raise NotImplementedError

    def enable_checkpointing(self, model: torch.nn.Module, checkpoint: CheckpointFn) -> None:
        """Make the model run its blocks through `checkpoint(block, *inputs)`."""
        raise NotImplementedError

    def next_block_inputs(self, output: Any, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        """The next block's inputs, from one block's output and its inputs, as the model's own
        loop hands them on: checkpointing contiguous blocks in one call runs that loop itself.
        Families whose `checkpoint_groups` is `segments` implement it."""
        raise NotImplementedError

    # Families with frozen encoders (`companions`) also implement these.

    def make_raw_batch(self, batch_size: int, resolution: int, device: torch.device) -> Batch:
        """The batch before encoding: images and token ids."""
        raise NotImplementedError

    def encode(
        self, raw: Batch, companions: dict[str, torch.nn.Module], dtype: torch.dtype
    ) -> Batch:
        """Run the frozen encoders on a raw batch, as a trainer that does not cache does."""
        raise NotImplementedError

    def validate(self, run: RunState, pipeline: Pipeline) -> None:
        """One validation image: the inference pipeline encodes the prompt with its text
        encoders, runs its denoiser step and decodes with its VAE (`pipeline.components`, each
        resident, loaded on the GPU, or offloaded: autofit/workloads/pipeline.py)."""
        raise NotImplementedError
