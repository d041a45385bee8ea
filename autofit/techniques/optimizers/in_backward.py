"""The optimizer step fused into the backward pass.

A parameter's update needs only its own gradient, so it can run the moment backward has made it,
and the gradient can be freed right there: the whole model's gradients never exist at once, only
those of the parameters whose group is not complete yet. A group is one parameter (kohya's
`fused_backward_pass`, torchtune's `optimizer_in_bwd`) or one transformer block (kohya's
`blockwise_fused_optimizers`: a block's gradients wait until the block's backward is done).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


class InBackwardOptimizer:
    """One optimizer per group of parameters, stepped inside backward when every parameter of the
    group has its gradient; it looks like one optimizer to the training loop, whose own step
    then finds nothing left to do."""

    def __init__(
        self, groups: Sequence[Sequence[torch.nn.Parameter]], build: Callable[[list[Any]], Any]
    ) -> None:
        self.optimizers = [build(list(group)) for group in groups]
        self._ready: list[set[int]] = [set() for _ in groups]
        for index, group in enumerate(groups):
            for param in group:
                param.register_post_accumulate_grad_hook(self._on_gradient(index, len(group)))

    def _on_gradient(self, index: int, size: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            ready = self._ready[index]
            ready.add(id(param))
            if len(ready) == size:
                self._step_group(index)

        return hook

    def _step_group(self, index: int) -> None:
        optimizer = self.optimizers[index]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self._ready[index].clear()

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    @property
    def state(self) -> dict[Any, Any]:
        return {k: v for optimizer in self.optimizers for k, v in optimizer.state.items()}

    def step(self, closure: Callable[[], Any] | None = None) -> None:
        # A group some of whose parameters got no gradient this step (a branch the batch did not
        # take) is stepped now, with what it has.
        for index, ready in enumerate(self._ready):
            if ready:
                self._step_group(index)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)
