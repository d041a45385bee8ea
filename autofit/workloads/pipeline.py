"""A validation pipeline's components, and where each waits until it runs.

A pipeline moved to the GPU whole (`validation=on`, `reload`) loads every component there, and they
stay for the pass. Under model CPU offload (`validation=offload`, what diffusers'
`enable_model_cpu_offload()` does) each component the pipeline loads waits in host memory, is
copied to the GPU just before it runs and copied back after, so at most one of them sits on the GPU
at a time, beside the training state. The copies are host-link traffic. What training holds (the
trained model, a frozen base, resident encoders) is used where it is.

A component runs through `forward`, or through `encode` and `decode` (a VAE); accelerate's offload
hook wraps the same entry points. It moves a component back when the next one starts; here it
moves back as soon as it returns, which differs only by what runs in between (nothing large).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from autofit.run_state import RunState

# The methods a component runs through (a VAE runs through encode and decode, not forward).
ENTRY_POINTS = ("forward", "encode", "decode")


class Pipeline:
    """The components a validation pass runs with, by name (the VAE and the text encoders)."""

    def __init__(self, run: RunState, offload: bool) -> None:
        self.run, self.offload = run, offload
        self.components: dict[str, nn.Module] = {}
        self._on_gpu: set[int] = set()  # offloaded components running now (ids)

    def load(self, build: Callable[[], nn.Module]) -> nn.Module:
        """A component the pipeline loads itself: on the GPU, or offloaded to host memory."""
        run = self.run
        if not self.offload:
            with run.device:
                return build().eval()
        with run.host_device, run.host():
            module = build().eval()
        for name in ENTRY_POINTS:
            if hasattr(module, name):
                setattr(module, name, self._running(module, getattr(module, name)))
        return module

    def _running(self, module: nn.Module, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            with self._on_device(module):
                return method(*args, **kwargs)

        return call

    @contextmanager
    def _on_device(self, module: nn.Module) -> Iterator[None]:
        if id(module) in self._on_gpu:  # an entry point called from another (forward -> decode)
            yield
            return
        _copy(module, self.run.to_device)
        self._on_gpu.add(id(module))
        try:
            yield
        finally:
            self._on_gpu.discard(id(module))
            _copy(module, self.run.to_host)


def _copy(module: nn.Module, copy: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Replace every weight and buffer of `module` with `copy` of it, in place (the parameters stay
    the same objects, as `Module.to` leaves them: autocast's cache of their casts outlives a move)."""
    for param in module.parameters():  # a shared weight once
        param.data = copy(param.data)
    moved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (old, new): old kept alive
    for sub in module.modules():
        for name, buffer in list(sub._buffers.items()):
            if buffer is not None:
                if id(buffer) not in moved:
                    moved[id(buffer)] = (buffer, copy(buffer))
                sub._buffers[name] = moved[id(buffer)][1]
