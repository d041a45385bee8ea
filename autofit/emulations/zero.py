"""DeepSpeed ZeRO's memory layout, emulated for fake tensors and for world sizes beyond one GPU.

Known limitations: DeepSpeed 0.19's engine is run for real only in a group of one process, so a
world size beyond one follows its source and its estimates, never a measured run; and:

- Gradients after the step: the emulation keeps its fp32 gradient share (and in stages 1 and 2
  the 16-bit share and the reduce bucket) from one step to the next, as DeepSpeed's estimates
  count them; DeepSpeed frees the fp32 gradients after the step, stage 3 keeping a 16-bit flat
  gradient partition (`grad_partitions_flat_buffer`) instead, and stage 2 frees the bucket and
  both shares (tests/test_offload.py holds each difference to the byte).
- DeepSpeed's configuration is taken at its defaults: one reduce bucket of 5e8 elements, whatever
  `reduce_bucket_size` says, and not the second one `overlap_comm: true` adds in stages 1 and 2
  (stage_1_and_2.py, `setup_buckets`); `contiguous_gradients`, `allgather_bucket_size`,
  `round_robin_gradients` and, without NVMe, `sub_group_size` are not read.
- Stages 1 and 2 flatten each group's trained 16-bit weights into one aligned buffer and
  partition that (`bit16_groups_flat`); here the weights stay tensors of their own and each
  weight's share is padded on its own (ceil(numel / N)), so padding and fragmentation differ.
- No loss scaler, overflow check or gradient norm: fp16's dynamic loss scaling, the small flags
  DeepSpeed keeps (two of 512 bytes) and the norm `gradient_clipping` (1.0 as exported) computes
  are not made; the update is AdamW with fixed hyperparameters, the only optimizer allowed.
- zero.Init partitions each module as it is built; the emulation builds the model whole in host
  memory and shards it after. NCCL's buffers and communicators are outside the allocator and not
  counted; the collectives are bytes sent (`peer_bytes`), not buffers.

A probe runs one process, so it cannot run DeepSpeed across N GPUs, and DeepSpeed does not run on
fake tensors; `ZeroEmulation` lays out one rank's memory as DeepSpeed does (the figures of
DeepSpeed's own `estimate_zero2_model_states_mem_needs` / `estimate_zero3_model_states_mem_needs`,
which tests/test_zero.py checks) and moves the same bytes:

- the model runs in 16-bit (bf16 or fp16); this rank holds an fp32 master copy, the two Adam
  moments and fp32 gradients of its 1/N share of every weight (16 bytes per parameter / N), and
  in stages 1 and 2 its 1/N share of the 16-bit gradients (2 more);
- stage 1 keeps every 16-bit gradient until the step; stage 2 reduce-scatters each gradient into
  the rank's share as it is made and frees it; stage 3 also keeps only the rank's share of the
  16-bit weights, gathering a module's full weights around its forward and its backward, and
  keeping more gathered (prefetched, persistent, soon reused) as DeepSpeed's parameter
  coordinator does (autofit/emulations/zero_gather.py, under the `zero3_*` knobs);
- `offload_params` leaves the shares of frozen weights of at most
  `stage3_param_persistence_threshold` elements on the GPU, as zero.Init puts them;
- `offload_optimizer=cpu` keeps the shares of master weights, moments and gradients in host
  memory and runs the update there (gradients cross the host link once, updated weights once).
- NVMe (ZeRO-Infinity, stage 3; autofit/emulations/nvme.py has DeepSpeed's figures):
  `offload_optimizer=nvme` keeps the optimizer's sub-groups of at least 1 MiB on the drive and
  holds only DeepSpeed's pinned swap buffers in host memory, through which each sub-group is read,
  updated and written back; `offload_params=nvme` keeps the weight shares on the drive (the
  trained ones up to `max_in_cpu` elements stay in pinned host memory) and reads each through
  DeepSpeed's pinned parameter buffers when its module gathers it.

Only the trained parameters have master weights, moments and gradients (LoRA: the adapters); stage
3 partitions every weight, the frozen base's too, as DeepSpeed's zero.Init does. A QLoRA base's
packed 4-bit weights are partitioned in the 16-bit storage dtype they must be given for it
(`bnb_4bit_quant_storage`: peft's docs/source/accelerate/deepspeed.md, "Use PEFT QLoRA and
DeepSpeed with ZeRO3"); their quantization state (scales, codes) stays whole on every rank.

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

from autofit.emulations.nvme import PARAM_MAX_IN_CPU, OptimizerSwap, ParameterSwap
from autofit.emulations.zero_gather import GatherCoordinator, Layout, LiveParams, gathered_buffers
from autofit.run_state import logical_numel, set_logical_numel
from autofit.techniques.optimizers import LEARNING_RATE

if TYPE_CHECKING:
    from autofit.run_state import RunState


REDUCE_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed's default reduce_bucket_size
DEEPSPEED_DEFAULTS = LiveParams()  # what ZeRO-3 keeps gathered, at DeepSpeed's defaults


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
        offload_optimizer: str,
        offload_params: str,
        live: LiveParams = DEEPSPEED_DEFAULTS,
    ) -> None:
        self.run, self.stage, self.world_size, self.live = run, stage, world_size, live
        self.offload = offload_optimizer != "none"
        self.params = run.trainable_parameters()
        self.offsets: dict[nn.Parameter, int] = {}
        half = self.params[0].dtype
        device = run.device
        # ZeRO-Infinity: the optimizer's large sub-groups live on NVMe, read and written through
        # pinned buffers; the rest of its state stays in host memory as with ZeRO-Offload.
        self.swap = (
            OptimizerSwap(run, [share(p.numel(), world_size) for p in self.params])
            if offload_optimizer == "nvme"
            else None
        )
        total = 0
        for index, param in enumerate(self.params):
            if self.swap and index in self.swap.swapped:
                self.offsets[param] = -1 - index  # on NVMe: its sub-group's slot in the buffers
                continue
            self.offsets[param] = total
            total += share(param.numel(), world_size)
        self._allocate_state(total, half)
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
        # Per step each rank sends (N-1)/N of what each collective carries (ring collectives): the
        # trained weights' 16-bit gradients once (reduce-scatter), and the weights once after the
        # step in stages 1 and 2 (the updated trained ones), twice in stage 3 (every weight,
        # gathered for forward and again for backward): the ZeRO paper's 2x and 3x the model.
        self.collective_bytes = sum(p.numel() * p.element_size() for p in self.params)
        if stage == 3:
            self._partition_weights(offload_params)
            self.collective_bytes += 2 * sum(
                s.numel() * s.element_size() * world_size for s in self.shards.values()
            )
        else:
            self.collective_bytes *= 2
        for param in self.params:
            param.register_post_accumulate_grad_hook(self._reduce_scatter)
        # Stages 1 and 2 update from buffers made here, so a first step's update can be traced
        # without its pass (TrainingRun.update_without_a_pass): stage 1 from each weight's
        # gradient, stage 2 from the share backward reduced them into (on the GPU or, offloaded,
        # the host), freeing them. Stage 3 gathers weights in its pass.
        self.updates_without_a_pass = stage < 3
        self.reads_gradients = stage < 2

    def _allocate_state(self, total: int, half: torch.dtype) -> None:
        """This rank's flat share (`total` elements) of the optimizer's state: fp32 master
        weights, fp32 gradients, the two moments and the step count, and the gradients' share
        as they are reduced into it (`half`: the 16-bit dtype), in host memory when the
        optimizer is offloaded."""
        run, device = self.run, self.run.device

        # DeepSpeed pins the master weights and gradients it offloads (pin_memory: true, as
        # exported); the moments are the CPU optimizer's own, pageable.
        def pinned() -> Any:
            return run.host(pinned=True) if self.offload else nullcontext()

        with pinned():
            host_device = run.host_device if self.offload else device
            self.master = torch.zeros(total, dtype=torch.float32, device=host_device)
            self.grads32 = torch.zeros_like(self.master)
        with run.host() if self.offload else nullcontext():
            self.exp_avg = torch.zeros_like(self.master)
            self.exp_avg_sq = torch.zeros_like(self.master)
            self.step_count = torch.zeros((), dtype=torch.float32, device=host_device)
        with pinned():
            # Stages 1 and 2 reduce gradients into a 16-bit share and cast it to fp32 for the step;
            # stage 3 reduces them straight into the fp32 share.
            self.grads = (
                self.grads32
                if self.stage == 3
                else torch.zeros(total, dtype=half, device=host_device)
            )

    # -- stage 3: weights partitioned, gathered around each module -------------------------------

    def _partition_weights(self, offload_params: str) -> None:
        run = self.run
        params = list(run.model.parameters())
        # offload_params=nvme: the trained shares up to `max_in_cpu` elements stay in pinned host
        # memory (stage3.py, _create_param_groups_fp16_flat_cpu_memory); every other share lives
        # on the drive, read into one of DeepSpeed's pinned buffers as its module gathers it.
        in_cpu = PARAM_MAX_IN_CPU
        on_nvme: set[nn.Parameter] = set()
        if offload_params == "nvme":
            largest = max(_partition_layout(p, run)[1] for p in params)
            self.param_buffers = ParameterSwap(run, share(largest, self.world_size))
            for param in params:
                n = share(param.numel(), self.world_size)
                if param.requires_grad and n <= in_cpu:
                    in_cpu -= n
                else:
                    on_nvme.add(param)
        self.full_shapes = {param: (param.shape, param.dtype) for param in params}
        partitioned = {param: _partition_layout(param, run)[1] for param in params}  # ds_numel
        # Weights of at most `stage3_param_persistence_threshold` elements stay gathered once
        # used. zero.Init keeps a frozen one's share on the GPU even when weights are offloaded
        # (too small for the drive, too); a trained one's moves to the optimizer's flat 16-bit
        # partition, in host memory when offloaded (stage3.py).
        persistent = {p for p in params if partitioned[p] <= self.live.persistence_threshold}
        on_gpu = (
            {p for p in persistent if not p.requires_grad} if offload_params != "none" else set()
        )
        on_nvme -= on_gpu
        for param in params:
            set_logical_numel(param, logical_numel(param))  # weights, not the shard's elements
            shard_dtype, numel = _partition_layout(param, run)
            if param in on_nvme:
                place, device, numel = nullcontext(), run.device, 0  # a placeholder, as DeepSpeed's
            elif offload_params != "none" and param not in on_gpu:
                place, device = run.host(pinned=True), run.host_device
                numel = share(numel, self.world_size)
            else:
                place, device = nullcontext(), run.device
                numel = share(numel, self.world_size)
            with place:
                self.shards[param] = torch.empty(numel, dtype=shard_dtype, device=device)
            if run.tracker:
                run.tracker.tag(self.shards[param], "parameters")
            param.data = self.shards[param]  # the full weight is freed

        self.layouts = {
            param: Layout(
                share(partitioned[param], self.world_size),
                self.shards[param].dtype,
                offload_params == "none" or param in on_gpu,
                *self.full_shapes[param],
            )
            for param in params
        }

        def gather(group: list[nn.Parameter]) -> Any:
            for param in group:
                shape, dtype = self.full_shapes[param]
                nbytes = share(shape.numel() * dtype.itemsize, self.world_size)
                if param in on_nvme:  # drive -> pinned buffer -> GPU
                    run.traffic.nvme_bytes += nbytes
                if not self.layouts[param].on_gpu:
                    run.traffic.link_bytes += nbytes
            return gathered_buffers(
                group,
                self.world_size,
                self.layouts.__getitem__,
                self.shards.__getitem__,
                run.device,
            )

        def release(param: nn.Parameter) -> None:
            param.data = self.shards[param]

        # DeepSpeed gathers each module's own weights, as its coordinator decides
        # (autofit/emulations/zero_gather.py).
        self.coordinator = GatherCoordinator(
            run.model, self.live, partitioned.__getitem__, gather, release
        )

    # -- gradients -----------------------------------------------------------------------------

    def _reduce_scatter(self, param: nn.Parameter) -> None:
        n = share(param.numel(), self.world_size)
        start = self.offsets[param]
        grad = param.grad.reshape(-1)[:n]
        if start < 0:  # its sub-group is on NVMe: through the pinned buffers to the drive
            self.run.traffic.link_bytes += n * grad.element_size()
            self.run.traffic.nvme_bytes += 4 * n
            self.swap.receive(-1 - start, grad)
        elif self.offload:
            self.run.traffic.link_bytes += n * grad.element_size()
            with self.run.host():
                self.grads[start : start + n].copy_(grad.to(self.run.host_device))
        else:
            self.grads[start : start + n].copy_(grad)
        if self.stage >= 2:
            param.grad = None

    # -- the step ------------------------------------------------------------------------------

    def step(self, closure: Callable[[], Any] | None = None) -> None:
        if self.stage == 3:  # backward's epilogue, then the step's start: every weight released
            self.coordinator.release_backward_leftovers()
            self.coordinator.release_all()
        self.run.traffic.peer_bytes += (
            self.collective_bytes * (self.world_size - 1) // self.world_size
        )
        place = self.run.host if self.offload else nullcontext
        with place():
            if self.grads is not self.grads32:
                self.grads32.copy_(self.grads)
            _adamw(self.master, self.grads32, self.exp_avg, self.exp_avg_sq, self.step_count)
        if self.offload:
            self.run.traffic.host_compute_bytes += self.master.numel() * (4 * 7 + 2)
        for param in self.params:
            start = self.offsets[param]
            if start >= 0:
                n = share(param.numel(), self.world_size)
                self._publish(param, self.master[start : start + n])
        if self.swap:  # each sub-group on NVMe: read, updated, written back
            self.swap.step(
                lambda *states: _adamw(*states, self.step_count),
                lambda index, source: self._publish(self.params[index], source),
            )
        if self.stage == 3:
            self.coordinator.gather_persistent()

    def _publish(self, param: nn.Parameter, source: torch.Tensor) -> None:
        """Write this rank's updated share of a 16-bit weight (all-gathered to the others)."""
        n = source.numel()
        target = self.shards.get(param, param.data).reshape(-1)[:n]
        if target.numel() == 0:  # its share lives on NVMe: written there from the host
            self.run.traffic.nvme_step_bytes += n * param.element_size()
        elif self.offload:
            self.run.traffic.link_bytes += n * target.element_size()
            with self.run.host():
                source = source.to(target.dtype)
            target.copy_(source.to(target.device))
        else:
            target.copy_(source)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.params:
            param.grad = None


def _adamw(
    master: torch.Tensor,
    grads: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: torch.Tensor,
) -> None:
    torch._fused_adamw_(
        [master], [grads], [exp_avg], [exp_avg_sq], [], [step],
        lr=LEARNING_RATE, beta1=0.9, beta2=0.999, weight_decay=0.01, eps=1e-8, amsgrad=False, maximize=False,
    )  # fmt: skip


def _partition_layout(param: nn.Parameter, run: RunState) -> tuple[torch.dtype, int]:
    """The dtype and element count ZeRO-3 partitions a weight in. A packed 4-bit weight (uint8)
    is stored in the run's 16-bit dtype (`bnb_4bit_quant_storage`), two bytes per element."""
    if param.dtype == torch.uint8:
        storage = run.dtypes.weights
        return storage, -(-param.numel() // storage.itemsize)
    return param.dtype, param.numel()
