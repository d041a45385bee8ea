"""PyTorch FSDP2's memory layout (`fully_shard`), emulated for fake tensors and for world sizes
beyond one GPU (the groups it shards: autofit/emulations/fsdp_groups.py; `fully_shard` itself for
real runs in a one-process group: autofit/emulations/fsdp_real.py).

Known limitations: what torch 2.13's FSDP2 does that this layout leaves out:

- Streams: every allocation is made on one stream. FSDP2 gathers on its copy-in and all-gather
  streams and reduces on its reduce-scatter stream (`FSDPCommContext.lazy_init`), each served
  from a pool of its own by the caching allocator; the FSDP1 emulation models those pools, this
  one does not.
- The real `fully_shard` is held against the emulation only in a one-process group
  (tests/test_fsdp.py), where each shard is the whole weight; with N > 1 the flat all-gather and
  reduce-scatter buffers follow torch's source, never a measured run (NCCL's own buffers, outside
  the allocator, are not counted). CPU offload is never held against torch: on the CPU it pins
  host memory, which needs a GPU, and no GPU test runs it.
- Only what accelerate configures: `Shard(0)` placement (no `shard_placement_fn`), a 1-D mesh
  (no HSDP all-reduce), `reshard_after_forward` as a bool (not an int), one dtype for param and
  reduce, implicit prefetching only (not `set_modules_to_forward_prefetch` /
  `set_modules_to_backward_prefetch`), and gradients reduced every step (not
  `set_requires_gradient_sync(False)`'s unsharded accumulation).

A probe runs one process, so it cannot run FSDP2 across N GPUs; `FsdpEmulation` lays out rank 0's
memory as torch 2.13's FSDP2 does (torch/distributed/fsdp/_fully_shard/: _fsdp_param.py,
_fsdp_param_group.py, _fsdp_collectives.py, _fsdp_state.py) and moves the same bytes:

- Sharding: every parameter is chunked on dim 0 (`torch.chunk`); rank 0 holds the first chunk,
  ceil(rows / N) rows, in the parameter's own dtype. The groups are those accelerate 1.15 makes
  (autofit/knobs/fsdp/): each block, an untied input embedding, the tail (final norm, output
  head) and the root; tail and root are never resharded after forward.
- Before a group's forward its parameters are all-gathered in the policy's param dtype: with
  N > 1 a flat buffer of every rank's shards (the all-gather output; the rank's own input is
  copied into it from a flat cast copy), then one padded tensor per parameter copied out of it;
  in forward the flat buffer lives until the next group's copy-out (FSDP2 defers its free to
  overlap the next all-gather), in backward it is freed at once. With N = 1 each shard is copied
  (cast) straight into its parameter's tensor. Resharding frees the gathered tensors.
- Backward: a group is gathered again when the gradient reaches its outputs (unless it never
  resharded), and the group before it in backward order has its all-gather issued then too
  (FSDP2's implicit backward prefetch). Once the group's backward is done its gradients (in the
  param dtype) are copied into one flat reduce-scatter input in the reduce dtype, freed, and
  reduced into a flat shard that is cast to the parameters' dtype; each sharded gradient is a
  view of it. The reduce-scatter input lives until the next group's reduction.
- The optimizer (any of the optimizer knob's) steps the shards, so its state is sharded too.
  Under LoRA every weight is sharded and only the adapters have gradients and state; a QLoRA
  base shards its packed 4-bit weights stored as bf16 (bitsandbytes' quant storage for FSDP).
- CPU offload (`CPUOffloadPolicy`): the shards live in pinned host memory and are copied to the
  GPU (and cast) before each all-gather; each sharded gradient is copied to pinned host memory;
  the optimizer step, and its state, run on the host.

Collectives count as `peer_bytes` ((N - 1) / N of each all-gather output and reduce-scatter
input, ring collectives), host copies as `link_bytes`, the host step as `host_compute_bytes`.
"""

from __future__ import annotations

import math
from contextlib import ExitStack, nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from autofit.emulations.fsdp_groups import Group, fsdp_groups
from autofit.run_state import set_logical_numel

if TYPE_CHECKING:
    from autofit.run_state import RunState

QUANT_STORAGE = torch.bfloat16  # FSDP-QLoRA's bnb_4bit_quant_storage


def shard_rows(rows: int, world_size: int) -> int:
    """Rows of a dim-0 chunk rank 0 holds (torch.chunk: every chunk but the last is this size)."""
    return -(-rows // world_size)


# -- the emulation ------------------------------------------------------------------------------


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


class _PostBackward(torch.autograd.Function):
    """FSDP2's RegisterPostBackwardFunction: an identity on a group's forward inputs whose
    backward runs once the gradients of those inputs exist, i.e. the group's backward is done."""

    @staticmethod
    def forward(ctx: Any, group: _GroupState, *inputs: torch.Tensor) -> Any:  # type: ignore[override]
        ctx.group = group
        return inputs

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:  # type: ignore[override]
        ctx.group.post_backward()
        return (None, *grads)


class _ParamState:
    """One parameter's FSDP state on rank 0: its shard, and how it is gathered."""

    def __init__(self, param: nn.Parameter, emulation: FsdpEmulation) -> None:
        self.param = param
        run, n = emulation.run, emulation.world_size
        packed = param.dtype == torch.uint8  # a 4-bit base, stored for FSDP in bf16
        self.dtype = QUANT_STORAGE if packed else param.dtype
        if packed:
            self.shape = torch.Size([math.ceil(param.numel() / QUANT_STORAGE.itemsize), 1])
        else:
            self.shape = param.shape if param.dim() else torch.Size([1])
        rows, rest = self.shape[0], self.shape[1:]
        self.shard_shape = torch.Size([shard_rows(rows, n), *rest])
        self.numel = self.shape.numel()
        self.padded = self.shard_shape.numel() * n  # the gathered tensor: every rank's chunk
        cast = emulation.param_dtype
        # FSDP2 casts only floating weights whose dtype differs (init_dtype_attrs).
        self.gather_dtype = cast if cast and self.dtype.is_floating_point else self.dtype
        self.trainable = param.requires_grad
        self.offload = emulation.offload
        with run.host(pinned=True) if self.offload else nullcontext():
            device = run.host_device if self.offload else run.device
            self.shard = torch.empty(self.shard_shape, dtype=self.dtype, device=device)
        run.tag([self.shard], "parameters")
        self.view_shape = param.shape  # what the module computes with once gathered
        if not hasattr(param, "autofit_numel"):  # parameter counts count weights, not shards
            set_logical_numel(param, param.numel())
        param.data = self.shard  # the full weight is freed

    @property
    def shard_bytes(self) -> int:
        return self.shard.numel() * self.shard.element_size()

    def gather_input(self, run: RunState) -> torch.Tensor:
        """What FSDP2 all-gathers from this rank: the shard, on the GPU, in the gather dtype
        (`all_gather_inputs`: a host shard is copied over first, then cast)."""
        source = self.shard
        if self.offload:
            run.traffic.link_bytes += self.shard_bytes
            source = source.to(run.device, copy=True)
        return source.to(self.gather_dtype)

    def gathered(self, run: RunState) -> torch.Tensor:
        """A fresh all-gather output of this parameter: every rank's padded chunk."""
        output = torch.empty(self.padded, dtype=self.gather_dtype, device=run.device)
        run.tag([output], "parameters")
        return output

    def unshard(self, output: torch.Tensor, gathered: dict[int, _ParamState]) -> None:
        if self.view_shape.numel() == self.numel:
            self.param.data = output[: self.numel].view(self.view_shape)
        else:  # a packed 4-bit weight: the layer reads its bytes, not its shape
            self.param.data = output[: self.numel].view(self.numel, 1)
        gathered[output.untyped_storage()._cdata] = self

    def reshard(self, gathered: dict[int, _ParamState]) -> None:
        gathered.pop(self.param.data.untyped_storage()._cdata, None)
        self.param.data = self.shard


class _GroupState:
    """One `fully_shard` group's runtime: gathered or not, and its hooks."""

    def __init__(self, group: Group, emulation: FsdpEmulation) -> None:
        self.emulation = emulation
        self.reshard_after_forward = group.reshard_after_forward
        self.modules = group.modules
        # fully_shard frees a group's unsharded weights when it returns, not each as its shard
        # is made (_fsdp_param.py, _init_sharded_param): those on the GPU (LoRA's adapters, made
        # there) are all held while the group's shards are made.
        unsharded = [p.data for p in group.params]
        self.params = [_ParamState(p, emulation) for p in group.params]
        del unsharded
        trained = [p for p in self.params if p.trainable]
        self.orig_dtype = trained[0].dtype if trained else None
        self.reduce_dtype = emulation.param_dtype or self.orig_dtype
        self.unsharded = False
        self.pending: torch.Tensor | None = None  # an issued all-gather's flat output
        self.state = "idle"
        self.post_forward_indices: list[int] = []
        # A group of several modules (the tail) runs FSDP2's pre-forward for each module, but
        # its post-forward (reshard, pre-backward hook on the output, state back to idle) only
        # once the last of them has run (_fsdp_state.py, _register_group_forward_hooks): its
        # post-backward hook goes on the inputs of the first module only.
        self.modules_to_run: set[int] = set()
        for module in group.modules:
            module.register_forward_pre_hook(self._pre_forward, with_kwargs=True)
            module.register_forward_hook(self._post_forward)

    # -- gathering -------------------------------------------------------------------------------

    def unshard(self) -> None:
        """FSDP2's `unshard`: issue the all-gather (N > 1: the flat output buffer)."""
        emulation = self.emulation
        if self.unsharded or self.pending is not None or emulation.world_size == 1:
            return
        run, n = emulation.run, emulation.world_size
        inputs = [p.gather_input(run) for p in self.params]
        dtypes = {t.dtype for t in inputs}
        dtype = dtypes.pop() if len(dtypes) == 1 else torch.uint8  # mixed dtypes go as bytes
        total = sum(t.numel() * t.element_size() for t in inputs) // dtype.itemsize
        casts = [p for p, t in zip(self.params, inputs, strict=True) if t is not p.shard]
        # The foreach fast path (16-bit params on the GPU) copies the casts into one flat input.
        foreach = emulation.param_dtype is not None and not emulation.offload and casts
        flat_input = None
        if foreach:
            flat_input = torch.empty(
                sum(p.shard.numel() for p in casts), dtype=emulation.param_dtype, device=run.device
            )
        self.pending = torch.empty(total * n, dtype=dtype, device=run.device)
        run.traffic.peer_bytes += total * dtype.itemsize * (n - 1)
        del inputs, flat_input

    def wait_for_unshard(self) -> None:
        """FSDP2's `wait_for_unshard`: the per-parameter copy-out, and the flat buffer's free."""
        emulation = self.emulation
        if self.unsharded:
            return
        run = emulation.run
        forward = self.state == "forward"
        if emulation.world_size == 1:
            # FSDP2's loop keeps each cast input until the next one exists (its loop variable).
            for param in self.params:
                source = param.gather_input(run)
                output = param.gathered(run)
                output[: source.numel()].view(source.shape).copy_(source)
                param.unshard(output, emulation.gathered)
        else:
            if forward:
                emulation.deferred = None  # the previous group's flat output
            for param in self.params:
                param.unshard(param.gathered(run), emulation.gathered)
            if forward:
                emulation.deferred = self.pending
            self.pending = None
        self.unsharded = True

    def reshard(self) -> None:
        for param in self.params:
            param.reshard(self.emulation.gathered)
        self.unsharded = False

    # -- hooks -----------------------------------------------------------------------------------

    def _pre_forward(self, module: nn.Module, args: Any, kwargs: Any) -> Any:
        if not self.modules_to_run:
            self.modules_to_run.update(id(m) for m in self.modules)
        entering = self.state != "forward"
        self.state = "forward"
        self.unshard()
        self.wait_for_unshard()
        if not entering or _in_backward() or not torch.is_grad_enabled():
            return None
        flat, spec = tree_flatten((args, kwargs))
        needs = [i for i, t in enumerate(flat) if isinstance(t, torch.Tensor) and t.requires_grad]
        if needs:
            wrapped = _PostBackward.apply(self, *(flat[i] for i in needs))
            for i, tensor in zip(needs, wrapped, strict=True):
                flat[i] = tensor
        return tree_unflatten(flat, spec)

    def _post_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        self.modules_to_run.discard(id(module))
        if self.modules_to_run:
            return  # the group's other modules are still to run
        emulation = self.emulation
        if not _in_backward():
            if self.reshard_after_forward:
                self.reshard()
            self.post_forward_indices.append(len(emulation.post_forward_order))
            emulation.post_forward_order.append(self)
        self.state = "idle"
        if module is emulation.run.model:
            emulation.deferred = None  # the root's post-forward frees the last flat output
        if torch.is_grad_enabled() and not _in_backward():
            for tensor in tree_flatten(output)[0]:
                if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                    tensor.register_hook(self._pre_backward)

    def _pre_backward(self, grad: torch.Tensor) -> torch.Tensor:
        if self.state == "pre_backward":
            return grad
        emulation = self.emulation
        emulation.queue_final_callback()
        self.state = "pre_backward"
        self.unshard()
        self.wait_for_unshard()
        if self.post_forward_indices:  # the implicit backward prefetch of the next group
            index = self.post_forward_indices.pop()
            if index > 0:
                emulation.post_forward_order[index - 1].unshard()
        return grad

    def post_backward(self) -> None:
        emulation = self.emulation
        self.state = "post_backward"
        if not self.params:
            return  # a group that manages no weights (the root) has no FSDPParamGroup to run
        run, n = emulation.run, emulation.world_size
        with_grad = [p for p in self.params if p.param.grad is not None]
        grads = [p.param.grad for p in with_grad]
        for param in with_grad:
            param.param.grad = None
        self.reshard()
        emulation.reduce_scatter_input = None  # at most one reduction in flight
        if not with_grad:
            return
        assert self.reduce_dtype is not None and self.orig_dtype is not None
        total = sum(p.padded for p in with_grad)
        emulation.reduce_scatter_input = torch.empty(
            total, dtype=self.reduce_dtype, device=run.device
        )
        run.traffic.peer_bytes += total * self.reduce_dtype.itemsize * (n - 1) // n
        del grads  # copied in: the unsharded gradients are freed
        reduced = torch.empty(total // n, dtype=self.reduce_dtype, device=run.device)
        if self.reduce_dtype != self.orig_dtype:
            reduced = reduced.to(self.orig_dtype)
        offset = 0
        for param in with_grad:
            numel = param.padded // n
            shard = reduced.as_strided(param.shard_shape, _contiguous_strides(param), offset)
            offset += numel
            if param.offload:
                run.traffic.link_bytes += shard.numel() * shard.element_size()
                with run.host(pinned=True):
                    shard = shard.to(run.host_device, copy=True)
            param.param.grad = shard
        run.tag([p.param.grad for p in with_grad], "gradients")
        del reduced


def _contiguous_strides(param: _ParamState) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(param.shard_shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


class FsdpEmulation:
    """Rank 0's memory under FSDP2 for `run`'s model: its hooks stay installed on the modules."""

    def __init__(
        self, run: RunState, reshard_after_forward: bool, world_size: int, offload: bool
    ) -> None:
        self.run, self.world_size, self.offload = run, world_size, offload
        # accelerate's MixedPrecisionPolicy from mixed_precision: param and reduce dtype alike
        self.param_dtype = run.dtypes.autocast
        self.deferred: torch.Tensor | None = None  # a forward all-gather's flat output
        self.reduce_scatter_input: torch.Tensor | None = None
        self.post_forward_order: list[_GroupState] = []
        self.callback_queued = False
        self.gathered: dict[int, _ParamState] = {}  # gathered storage -> its parameter
        self.saving = ExitStack()
        groups = fsdp_groups(run.model, run.preset, reshard_after_forward)
        self.groups = [_GroupState(group, self) for group in groups]
        order = {id(m): i for i, m in enumerate(run.model.modules())}
        # FSDP2's final callback visits the root's state first, then the others in module order.
        self.final_order = [self.groups[-1]] + sorted(
            self.groups[:-1], key=lambda g: order[id(g.modules[0])]
        )
        for name, buffer in list(run.model.named_buffers()):  # fully_shard moves buffers over
            module_name, _, leaf = name.rpartition(".")
            module = run.model.get_submodule(module_name)
            module._buffers[leaf] = moved = buffer.to(run.device, copy=True)
            run.tag([moved], "parameters")
        if offload:
            step_on_host(run, run.optimizer)
        run.model.register_forward_pre_hook(lambda *_: self._save_by_reference())
        run.model.register_forward_hook(lambda *_: self.saving.close())

    # -- what autograd keeps of a gathered weight ---------------------------------------------------

    def _save_by_reference(self) -> None:
        """FSDP2 frees a gathered weight by resizing its storage to nothing and gathers it back
        into the same storage, so what autograd saved of it (the transposed weight a matmul
        keeps) holds no memory in between and sees the weight again in backward. A saved view
        of a gathered storage is kept here as where it lies in its parameter, and rebuilt from
        the parameter's data, gathered again by then, when backward unpacks it."""
        if torch.is_grad_enabled() and not _in_backward():
            self.saving.enter_context(
                torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            )

    def _pack(self, tensor: torch.Tensor) -> Any:
        param = self.gathered.get(tensor.untyped_storage()._cdata)
        if param is None:
            return tensor
        return (param, tensor.size(), tensor.stride(), tensor.storage_offset())

    @staticmethod
    def _unpack(saved: Any) -> torch.Tensor:
        if isinstance(saved, torch.Tensor):
            return saved
        param, size, stride, offset = saved
        return param.param.data.as_strided(size, stride, offset)

    def queue_final_callback(self) -> None:
        if not self.callback_queued:
            self.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._final_callback)

    def _final_callback(self) -> None:
        """FSDP2's root post-backward callback: groups whose inputs needed no gradient reduce
        here; every gathered weight is freed, and the last reduce-scatter input."""
        for group in self.final_order:
            if group.state != "post_backward":
                group.post_backward()
            group.state = "idle"
            group.post_forward_indices.clear()
        self.post_forward_order.clear()
        self.reduce_scatter_input = None
        self.callback_queued = False


def step_on_host(run: RunState, optimizer: Any) -> None:
    """CPU offload (FSDP2's CPUOffloadPolicy, FSDP1's CPUOffload): the step runs on the host
    shards, its state created there."""
    stack = ExitStack()

    def before(*_: Any) -> None:
        stack.enter_context(run.host())

    def after(opt: Any, *_: Any) -> None:
        stack.close()
        for group in opt.param_groups:
            for param in group["params"]:
                state = opt.state.get(param, {})
                states = sum(
                    t.numel() * t.element_size()
                    for t in state.values()
                    if isinstance(t, torch.Tensor)
                )
                grad = param.numel() * param.element_size() if param.grad is not None else 0
                # Read and written: the weight and its states, and the gradient read.
                run.traffic.host_compute_bytes += 2 * (grad + states) + grad

    optimizer.register_step_pre_hook(before)
    optimizer.register_step_post_hook(after)
