"""Parameters that are not resident on the GPU, materialised around the modules that use them.

Block swap keeps some transformer blocks' weights in host memory and ZeRO-3 keeps only a shard of
each weight on each GPU; both bring a module's full weights onto the GPU just before the module
runs forward, drop them right after, and bring them back for its backward. `stream_parameters`
does that with module hooks, swapping each parameter's data in place (`param.data = ...`), so
every reference autograd saved to the parameter sees whichever data is current: the backward
pre-hook has restored the full weights by the time backward needs them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Materialize = Callable[[nn.Parameter], torch.Tensor]  # resident data -> full data on the GPU
Release = Callable[[nn.Parameter], torch.Tensor]  # -> the resident data to switch back to


class ParameterStream:
    """Hooks that materialise `module`'s parameters (all of them, its children's included)
    around its forward and its backward.

    Under gradient checkpointing the module's forward runs again inside its backward, to
    recompute activations; the weights must then stay until the backward is done, so the
    forward hook releases them only outside the module's backward.
    """

    def __init__(self, module: nn.Module, materialize: Materialize, release: Release) -> None:
        self.params = list(module.parameters())
        self.materialize, self.release = materialize, release
        self.present = False
        self.in_backward = False
        module.register_forward_pre_hook(self._bring)
        module.register_forward_hook(self._after_forward)
        module.register_full_backward_pre_hook(self._before_backward)
        module.register_full_backward_hook(self._after_backward)

    def bring(self) -> None:
        if not self.present:
            for param in self.params:
                param.data = self.materialize(param)
            self.present = True

    def drop(self) -> None:
        if self.present:
            for param in self.params:
                param.data = self.release(param)
            self.present = False

    def _bring(self, *_: Any) -> None:
        self.bring()

    def _after_forward(self, *_: Any) -> None:
        if not self.in_backward:
            self.drop()

    def _before_backward(self, *_: Any) -> None:
        self.in_backward = True
        self.bring()

    def _after_backward(self, *_: Any) -> None:
        self.in_backward = False
        self.drop()


def stream_parameters(
    modules: list[nn.Module], materialize: Materialize, release: Release
) -> list[ParameterStream]:
    return [ParameterStream(module, materialize, release) for module in modules]
