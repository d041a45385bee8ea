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


class BlockRing:
    """sd-scripts' block swap over one list of blocks: the first `resident` blocks start on the
    GPU, the rest in host memory, and never more than `resident` of them are on the GPU.

    A block that must run (forward, or backward) and is not there takes the slot of the block
    used longest ago: in forward the block `resident` places before it, done with its forward; in
    backward the one `resident` places after it, done with its backward. That block's weights go
    to the host and the needed block's come in, one exchange at a time (sd-scripts' single swap
    thread), each on the host link both ways. sd-scripts issues the exchange as soon as the
    evicted block is done, so it overlaps the compute of the blocks in between; `on_swap` is told
    when each exchange could start and when it was needed, on the caller's clock, to price that.
    """

    def __init__(
        self,
        blocks: list[nn.Module],
        resident: int,
        params: Callable[[nn.Module], list[nn.Parameter]],
        to_host: Callable[[torch.Tensor], torch.Tensor],
        to_device: Callable[[torch.Tensor], torch.Tensor],
        clock: Callable[[], float],
        on_swap: Callable[[float, float, int], None],
    ) -> None:
        assert 0 < resident < len(blocks)
        self.params = {block: params(block) for block in blocks}
        self.to_host, self.to_device, self.clock, self.on_swap = to_host, to_device, clock, on_swap
        self.host: dict[nn.Parameter, torch.Tensor] = {}
        self.present: dict[nn.Module, None] = dict.fromkeys(blocks[:resident])  # oldest use first
        self.done_at: dict[nn.Module, float] = {}
        for block in blocks[resident:]:
            self._evict(block)
        for block in blocks:
            block.register_forward_pre_hook(lambda module, *_: self._need(module))
            block.register_forward_hook(lambda module, *_: self._done(module))
            block.register_full_backward_pre_hook(lambda module, *_: self._need(module))
            block.register_full_backward_hook(lambda module, *_: self._done(module))

    def _evict(self, block: nn.Module) -> int:
        moved = 0
        for param in self.params[block]:
            self.host[param] = self.to_host(param.data)
            param.data = self.host[param]
            moved += param.numel() * param.element_size()
        return moved

    def _bring(self, block: nn.Module) -> int:
        moved = 0
        for param in self.params[block]:
            param.data = self.to_device(self.host.pop(param))
            moved += param.numel() * param.element_size()
        return moved

    def _need(self, block: nn.Module) -> None:
        if block in self.present:
            self.present[block] = self.present.pop(block)  # most recently used now
            return
        oldest = next(iter(self.present))
        del self.present[oldest]
        moved = self._evict(oldest) + self._bring(block)
        self.present[block] = None
        self.on_swap(self.done_at.get(oldest, 0.0), self.clock(), moved)

    def _done(self, block: nn.Module) -> None:
        self.done_at[block] = self.clock()
