"""Random weights for a model built in host memory, at the speed of a copy.

A QLoRA, fp8-base or block-swapping probe builds its 16-bit model on the host, as a loader reads
a checkpoint there, and moves each weight to the GPU (quantizing or casting it on the way). The
weights are random, and their values change neither the memory nor the time of a step; but the
CPU draws random numbers one thread at a time, about 0.1 billion a second, so initialising
Llama 3 8B took over a minute per probe, and a real QLoRA probe on an H100 ran past its 150 s
timeout (calibration/h100_80-published.csv, N-TTQ1). Inside `tiled_random_init`, every large
host tensor's `normal_` and `uniform_` (what torch.nn.init, transformers' and diffusers'
initialisers call) copies a tile of numbers drawn once, scaled to the asked-for distribution,
instead of drawing each: same shapes, dtypes and distribution per tile, the same memory.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from autofit.simulator.tracker import uncounted

# A tile of 2**20 numbers: large enough that a weight holds no short period (a layer's row is at
# most tens of thousands), small enough to draw in milliseconds. Smaller tensors draw their own.
TILE = 1 << 20


@functools.cache
def _tile(kind: str) -> np.ndarray:
    # numpy's memory, which no tracker counts: the tile outlives every run that uses it.
    generator = np.random.default_rng(0)
    if kind == "normal":
        return generator.standard_normal(TILE, dtype=np.float32)
    return generator.random(TILE, dtype=np.float32)


def _tiled(tensor: torch.Tensor, kind: str, scale: float, shift: float) -> None:
    """`tensor` filled with the tile, times `scale` plus `shift`, over and over."""
    flat = tensor.view(-1)
    whole, rest = divmod(flat.numel(), TILE)
    # the scaled tile is a temporary of the fill, not of the run: counted nowhere
    with torch.no_grad(), uncounted():
        tile = (torch.from_numpy(_tile(kind)) * scale + shift).to(tensor.dtype)
        if whole:
            flat[: whole * TILE].view(whole, TILE).copy_(tile.expand(whole, TILE))
        if rest:
            flat[whole * TILE :].copy_(tile[:rest])
        del tile


def _large_on_host(tensor: torch.Tensor) -> bool:
    return (
        tensor.device.type == "cpu"
        and tensor.is_floating_point()
        and tensor.is_contiguous()
        and tensor.numel() > TILE
        and not isinstance(tensor, torch._subclasses.FakeTensor)
    )


@contextmanager
def tiled_random_init() -> Iterator[None]:
    """While inside, large host tensors are filled from a drawn tile (see the module's text)."""
    normal, uniform = torch.Tensor.normal_, torch.Tensor.uniform_

    def normal_(self: torch.Tensor, mean: float = 0.0, std: float = 1.0, **kwargs: Any) -> Any:
        if not _large_on_host(self):
            return normal(self, mean, std, **kwargs)
        _tiled(self, "normal", std, mean)
        return self

    def uniform_(self: torch.Tensor, a: float = 0.0, b: float = 1.0, **kwargs: Any) -> Any:
        if not _large_on_host(self):
            return uniform(self, a, b, **kwargs)
        _tiled(self, "uniform", b - a, a)
        return self

    torch.Tensor.normal_, torch.Tensor.uniform_ = normal_, uniform_  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.normal_, torch.Tensor.uniform_ = normal, uniform  # type: ignore[method-assign]
