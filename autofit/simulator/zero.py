"""DeepSpeed ZeRO's memory layout, emulated for fake tensors and for world sizes beyond one GPU.

A probe runs one process, so it cannot run DeepSpeed across N GPUs, and DeepSpeed does not run on
fake tensors; `ZeroEmulation` lays out one rank's memory as DeepSpeed does (the figures of
DeepSpeed's own `estimate_zero2_model_states_mem_needs` / `estimate_zero3_model_states_mem_needs`,
which tests/test_zero.py checks) and moves the same bytes:

- the model runs in 16-bit (bf16 or fp16); this rank holds an fp32 master copy, the two Adam
  moments and fp32 gradients of its 1/N share of every weight (16 bytes per parameter / N), and
  in stages 1 and 2 its 1/N share of the 16-bit gradients (2 more);
- stage 1 keeps every 16-bit gradient until the step; stage 2 reduce-scatters each gradient into
  the rank's share as it is made and frees it; stage 3 also keeps only the rank's share of the
  16-bit weights, gathering a module's full weights just before it runs (forward and backward) and
  dropping them after;
- `offload_optimizer=cpu` keeps the shares of master weights, moments and gradients in host
  memory and runs the update there (gradients cross the host link once, updated weights once);
  `offload_params=cpu` (stage 3) keeps the weight shares there too.

The update is torch's fused AdamW over the flat share, as DeepSpeed's fused Adam does it. With
DeepSpeed's default configuration every stage also holds a 16-bit gradient bucket of 5e8
elements (1 GB), which the estimates leave out; it counts as temporaries here.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from autofit.optimizers import LEARNING_RATE
from autofit.run_state import logical_numel, set_logical_numel
from autofit.simulator.streaming import ParameterStream

if TYPE_CHECKING:
    from autofit.run_state import RunState


REDUCE_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed's default reduce_bucket_size


def share(numel: int, world_size: int) -> int:
    """Elements of a tensor one of `world_size` ranks holds (DeepSpeed pads to an even split)."""
    return -(-numel // world_size)


class ZeroEmulation:
    """One rank's view of a ZeRO optimizer over `run`'s trainable parameters."""

    def __init__(
        self,
        run: RunState,
        stage: int,
        world_size: int,
        offload_optimizer: bool,
        offload_params: bool,
    ) -> None:
        self.run, self.stage, self.world_size = run, stage, world_size
        self.offload = offload_optimizer
        self.params = run.trainable_parameters()
        self.offsets: dict[nn.Parameter, int] = {}
        total = 0
        for param in self.params:
            self.offsets[param] = total
            total += share(param.numel(), world_size)
        half = self.params[0].dtype
        device = run.device
        place = run.host if offload_optimizer else nullcontext
        with place():
            host_device = run.host_device if offload_optimizer else device
            self.master = torch.zeros(total, dtype=torch.float32, device=host_device)
            self.exp_avg = torch.zeros_like(self.master)
            self.exp_avg_sq = torch.zeros_like(self.master)
            self.grads32 = torch.zeros_like(self.master)
            # Stages 1 and 2 reduce gradients into a 16-bit share and cast it to fp32 for the step;
            # stage 3 reduces them straight into the fp32 share.
            self.grads = (
                self.grads32 if stage == 3 else torch.zeros(total, dtype=half, device=host_device)
            )
            self.step_count = torch.zeros((), dtype=torch.float32, device=host_device)
        # The bucket gradients are gathered into before each reduction (`reduce_bucket_size`,
        # 5e8 elements by default): DeepSpeed allocates it whole, whatever the model's size.
        self.bucket = torch.empty(REDUCE_BUCKET_ELEMENTS, dtype=half, device=device)
        self.param_groups = [{"params": self.params, "lr": LEARNING_RATE}]
        self.state = {
            "partition": {
                "master": self.master,
                "exp_avg": self.exp_avg,
                "exp_avg_sq": self.exp_avg_sq,
                "step": self.step_count,
            }
        }
        if run.tracker:  # the reduced gradient shares are gradients, whatever else is tagged
            for buffer in (self.grads, self.grads32):
                run.tracker.tag(buffer, "gradients")
        self.shards: dict[nn.Parameter, torch.Tensor] = {}
        if stage == 3:
            self._partition_weights(offload_params)
        # Per step each rank sends (N-1)/N of the 16-bit weights once per all-gather and of the
        # 16-bit gradients once per reduce-scatter (ring collectives).
        self.sixteen_bit_bytes = 2 * sum(logical_numel(p) for p in self.params)
        for param in self.params:
            param.register_post_accumulate_grad_hook(self._reduce_scatter)

    # -- stage 3: weights partitioned, gathered around each module -------------------------------

    def _partition_weights(self, offload_params: bool) -> None:
        run = self.run
        place = run.host if offload_params else nullcontext
        self.full_shapes = {param: param.shape for param in run.model.parameters()}
        for param in run.model.parameters():
            set_logical_numel(param, param.numel())
            with place():
                device = run.host_device if offload_params else run.device
                self.shards[param] = torch.empty(
                    share(param.numel(), self.world_size), dtype=param.dtype, device=device
                )
            if run.tracker:
                run.tracker.tag(self.shards[param], "parameters")
            param.data = self.shards[param]  # the full weight is freed

        def gather(param: nn.Parameter) -> torch.Tensor:
            if offload_params:
                run.traffic.link_bytes += (
                    self.shards[param].numel() * self.shards[param].element_size()
                )
            return torch.empty(self.full_shapes[param], dtype=param.dtype, device=run.device)

        def release(param: nn.Parameter) -> torch.Tensor:
            return self.shards[param]

        # DeepSpeed gathers each module's own weights (the granularity of its estimate's
        # "largest layer").
        for module in run.model.modules():
            if any(True for _ in module.parameters(recurse=False)):
                _ModuleWeights(module, gather, release)

    # -- gradients -----------------------------------------------------------------------------

    def _reduce_scatter(self, param: nn.Parameter) -> None:
        n = share(param.numel(), self.world_size)
        start = self.offsets[param]
        grad = param.grad.reshape(-1)[:n]
        if self.offload:
            self.run.traffic.link_bytes += n * grad.element_size()
            with self.run.host():
                self.grads[start : start + n].copy_(grad.to(self.run.host_device))
        else:
            self.grads[start : start + n].copy_(grad)
        if self.stage >= 2:
            param.grad = None
        if self.stage == 3:
            param.data = self.shards[param]  # the weight's backward is done: drop the gathered copy

    # -- the step ------------------------------------------------------------------------------

    def step(self, closure: Callable[[], Any] | None = None) -> None:
        # One all-gather and one reduce-scatter in stages 1 and 2; stage 3 gathers the weights
        # for forward and again for backward.
        collectives = 4 if self.stage == 3 else 2
        self.run.traffic.peer_bytes += (
            collectives * self.sixteen_bit_bytes * (self.world_size - 1) // self.world_size
        )
        place = self.run.host if self.offload else nullcontext
        with place():
            if self.grads is not self.grads32:
                self.grads32.copy_(self.grads)
            torch._fused_adamw_(
                [self.master], [self.grads32], [self.exp_avg], [self.exp_avg_sq], [], [self.step_count],
                lr=LEARNING_RATE, beta1=0.9, beta2=0.999, weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False,
            )  # fmt: skip
        if self.offload:
            self.run.traffic.host_compute_bytes += self.master.numel() * (4 * 7 + 2)
        # All-gather the updated 16-bit weights (this rank writes its share of each).
        for param in self.params:
            n, start = share(param.numel(), self.world_size), self.offsets[param]
            target = self.shards.get(param, param.data).reshape(-1)[:n]
            source = self.master[start : start + n]
            if self.offload:
                self.run.traffic.link_bytes += n * target.element_size()
                with self.run.host():
                    source = source.to(target.dtype)
                target.copy_(source.to(target.device))
            else:
                target.copy_(source)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.params:
            param.grad = None


def _holds(param: nn.Parameter, tensor: torch.Tensor) -> bool:
    return param.untyped_storage()._cdata == tensor.untyped_storage()._cdata


class _ModuleWeights(ParameterStream):
    """ZeRO-3's gathering: like a ParameterStream over the module's own weights, except that in
    backward a weight is dropped by its gradient hook, once its gradient is reduced. A module's
    backward hook is no guide there: when none of the module's inputs needs a gradient, PyTorch
    fires it as soon as the output's gradient arrives, before the module's backward has run.
    Each weight is gathered or dropped on its own, by whether it holds its shard."""

    def __init__(self, module: nn.Module, materialize: Any, release: Any) -> None:
        super().__init__(module, materialize, release)
        self.params = list(module.parameters(recurse=False))

    def bring(self) -> None:
        for param in self.params:
            if _holds(param, self.release(param)):
                param.data = self.materialize(param)

    def drop(self) -> None:
        for param in self.params:
            if not _holds(param, self.release(param)):
                param.data = self.release(param)

    def _after_backward(self, *_: Any) -> None:
        self.in_backward = False
