"""One optimizer step over parameters some of which live in host memory.

Parameters kept on the host (swapped blocks) have their gradients moved there as they are made,
and their update runs on the host CPU with its state in host memory, as trainers that offload do;
the GPU-resident parameters are updated on the GPU as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from autofit.run_state import RunState


class HostSplitOptimizer:
    """Steps `on_device` on the GPU and `on_host` on the host, as one optimizer."""

    def __init__(self, on_device: Any, on_host: Any, run: RunState) -> None:
        self.on_device, self.on_host, self.run = on_device, on_host, run

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [*self.on_device.param_groups, *self.on_host.param_groups]

    @property
    def state(self) -> dict[Any, Any]:
        return {**self.on_device.state, **self.on_host.state}

    def step(self, closure: Callable[[], Any] | None = None) -> None:
        self.on_device.step()
        # The host parameters' gradients were moved to the host as they were made; they become
        # `.grad` only now, when the parameters are on the host too.
        for param, grad in self.run.host_gradients.items():
            param.grad = grad
        self.run.host_gradients.clear()
        with self.run.host():
            self.on_host.step()
        # The host update reads and writes each parameter and its state and reads its gradient.
        moved = 0
        for group in self.on_host.param_groups:
            for param in group["params"]:
                state = self.on_host.state.get(param, {})
                states = sum(
                    v.numel() * v.element_size()
                    for v in state.values()
                    if isinstance(v, torch.Tensor)
                )
                moved += 3 * param.numel() * param.element_size() + 2 * states
        self.run.traffic.host_compute_bytes += moved

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.on_device.zero_grad(set_to_none=set_to_none)
        self.on_host.zero_grad(set_to_none=set_to_none)
