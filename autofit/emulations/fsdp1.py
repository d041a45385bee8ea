"""PyTorch FSDP1's memory layout (`FullyShardedDataParallel`, flat parameters,
`use_orig_params=False`), emulated for one rank of `world_size` GPUs (the units it wraps:
autofit/emulations/fsdp1_units.py; FSDP1 itself for real runs: autofit/emulations/fsdp1_real.py).

Known limitations: what torch 2.13's FSDP1 does that this layout leaves out:

- The CUDA streams' work (below) is the allocation order itself, so `limit_all_gathers`' rate
  limiter (at most two all-gathers in flight) and `record_stream`'s delayed frees (a block freed
  on one stream while another may still read it returns to its pool once that stream is done)
  are not modelled.
- Forward prefetch, `use_orig_params=True` (its per-parameter alignment padding and views), the
  hybrid strategies (`HYBRID_SHARD`, `_HYBRID_SHARD_ZERO2`) and a `MixedPrecision` whose reduce
  dtype differs from its param dtype are not modelled.
- The model is flattened unit by unit from host memory (rank 0 of `sync_module_states`), the
  other ranks' meta-device initialisation not.
- FSDP1 itself is held against the emulation in a fake group of 1, 2 and 4 ranks whose
  collectives move nothing (tests/test_fsdp1.py): NCCL's buffers are outside the allocator and
  not counted, and `CPUOffload` is never held against torch (fsdp1_real.py does not pass it).

It follows torch 2.13's FSDP1 (torch/distributed/fsdp/: fully_sharded_data_parallel.py,
_runtime_utils.py, _flat_param.py, _exec_order_utils.py) as accelerate's `fsdp_version: 1`, the
HF Trainer and Lightning's FSDPStrategy configure it: transformer-block auto-wrap (each block a
unit; under LoRA each adapter layer too, PEFT's `fsdp_auto_wrap_policy`), the root unit holding
the rest, FULL_SHARD or SHARD_GRAD_OP, `backward_prefetch=BACKWARD_PRE`, `limit_all_gathers`,
`MixedPrecision(param_dtype, reduce_dtype, buffer_dtype)` from the precision knob. Per unit rank 0
holds, and the emulation allocates and frees as FSDP1 does:

- the flat shard (`_local_shard`): every parameter of the unit flattened into one tensor, chunked
  into `world_size` equal padded pieces, in the weights' dtype (pinned host memory under
  `CPUOffload(offload_params=True)`); a unit's weights must share dtype and requires_grad;
- under mixed precision, the low-precision shard (`_mp_shard`), made before each all-gather and
  freed after it; with offload, the shard's GPU copy in its own dtype made first;
- the padded unsharded flat parameter (`_full_param_padded`, `world_size` shards, in the compute
  dtype), gathered before forward and freed after it, except in the root unit, which is never
  resharded after forward (`_post_forward_reshard`): embedding, final norm and head stay gathered
  into backward; SHARD_GRAD_OP keeps every unit's from forward to its backward. The module's
  weights are views of it (autograd saves views of a storage FSDP1 resizes to nothing and back);
- backward: a unit is gathered again when the gradient reaches its output, and the unit that
  finished forward before it is gathered too (BACKWARD_PRE prefetch) before the current one's
  gradient is reduced; autograd concatenates the views' gradients into one unsharded flat gradient
  in the compute dtype; the post-backward hook reshards, casts it to the reduce dtype, pads it to
  `world_size` shards (F.pad: a second copy when padding is needed), reduce-scatters into a new
  shard and casts that to the weights' dtype (`_saved_grad_shard`), which becomes `.grad` in the
  final callback. With offload each shard gradient is copied into a pinned host gradient, and the
  GPU copies are freed only in the final callback, once backward is done;
- a frozen unit (LoRA's base) reshards when its inputs' gradients exist (multi-grad hook), the
  root in the final callback;
- one process has no peers: at `world_size=1` FSDP1 runs NO_SHARD (`_init_utils.py`), whose flat
  parameter is whole and whose gradient is all-reduced in place; the emulation does the same.

Each allocation is made on the CUDA stream FSDP1 makes it on (`PRE_UNSHARD`, `UNSHARD`,
`POST_BACKWARD` below, the default stream otherwise), and the caching allocator's model keeps a pool
per stream: a block freed after one unit's all-gather serves the next all-gather, never an
activation (c10/cuda/CUDACachingAllocator.cpp, `get_free_block` matches the block's stream).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_flatten

from autofit.emulations.fsdp import QUANT_STORAGE, step_on_host
from autofit.emulations.fsdp1_units import Unit, fsdp1_units
from autofit.run_state import logical_numel, set_logical_numel

if TYPE_CHECKING:
    from autofit.run_state import RunState

# The CUDA streams FSDP1 allocates on besides the default one (_init_streams in
# torch/distributed/fsdp/_runtime_utils.py): the caching allocator serves each from a pool of its
# own (a freed block is reused only by a request on the stream it was allocated on).
PRE_UNSHARD = 1  # _pre_unshard_stream: the low-precision shard, the offloaded shard's GPU copy
UNSHARD = 2  # _unshard_stream: the all-gathered padded flat parameter
POST_BACKWARD = 3  # _post_backward_stream: the reduce dtype's gradient, its padded copy, the shard


# -- the emulation ------------------------------------------------------------------------------


def _free(tensor: torch.Tensor) -> None:
    tensor.untyped_storage().resize_(0)


def _alloc(tensor: torch.Tensor, numel: int) -> None:
    tensor.untyped_storage().resize_(numel * tensor.element_size())


def _allocated(tensor: torch.Tensor) -> bool:
    return tensor.untyped_storage().size() > 0


class _Handle:
    """One unit's FlatParamHandle on rank 0."""

    def __init__(self, unit: Unit, emulation: Fsdp1Emulation, is_root: bool) -> None:
        run, n = emulation.run, emulation.world_size
        self.emulation, self.unit, self.is_root = emulation, unit, is_root
        self.sharded = n > 1
        self.infos = [(m, name, p.shape, p.dtype == torch.uint8) for m, name, p in unit.params]
        dtypes = {QUANT_STORAGE if p.dtype == torch.uint8 else p.dtype for _, _, p in unit.params}
        assert len(dtypes) <= 1, f"FSDP1 flattens one dtype per unit, not {dtypes}"
        self.orig_dtype = dtypes.pop() if dtypes else torch.float32
        cast = emulation.param_dtype
        self.param_dtype = cast if cast and self.orig_dtype.is_floating_point else self.orig_dtype
        self.uses_mp = self.param_dtype != self.orig_dtype
        self.reduce_dtype = cast if cast else self.orig_dtype
        self.numels = [self._numel(p) for _, _, p in unit.params]
        self.numel = sum(self.numels)
        self.shard_numel = -(-self.numel // n)
        self.offload = emulation.offload
        requires_grad = any(p.requires_grad for _, _, p in unit.params)
        logical = sum(logical_numel(p) for _, _, p in unit.params)
        # flatten_tensors: the unit is moved to the device, then concatenated (torch.cat).
        moved = [self._flat_view(p.detach().to(run.device)) for _, _, p in unit.params]
        flat = torch.cat(moved) if moved else torch.empty(0, device=run.device)
        del moved
        self.shared = list(unit.shared)
        for module, name, _ in unit.params:
            module._parameters.pop(name, None)
        for module, name, _ in self.shared:
            module._parameters.pop(name, None)
        unit.params.clear()  # the original weights are freed
        unit.shared.clear()
        self._set_views(flat)  # FlatParamHandle.__init__: views of the unsharded flat parameter
        with run.host(pinned=True) if self.offload else nullcontext():
            device = run.host_device if self.offload else run.device
            if self.sharded:  # shard(): a clone of rank 0's chunk, padded by F.pad if short
                chunk = flat[: self.shard_numel].to(device, copy=True)
                if chunk.numel() < self.shard_numel:
                    chunk = F.pad(chunk, [0, self.shard_numel - chunk.numel()])
                _free(flat)
                local = chunk
            else:
                local = flat.to(device)
        del flat
        self.flat = nn.Parameter(local, requires_grad=requires_grad)
        set_logical_numel(self.flat, logical)  # parameter counts count weights, not shards
        unit.module.register_parameter("_flat_param", self.flat)
        run.tag([self.flat], "parameters")
        self.local_shard = self.flat.data
        self.mp_shard: torch.Tensor | None = None
        self.full: torch.Tensor | None = None
        self.cpu_grad: torch.Tensor | None = None
        self.saved_grad_shard: torch.Tensor | None = None
        self.has_saved_grad = False
        self.state = "idle"
        self.prefetched = False
        self.needs_pre_backward_unshard = False
        self.ran_pre_backward = False
        self.post_forward_index: int | None = None
        self.hook: Any = None  # (what keeps its node alive, the hook's handle), per iteration
        self.post_backward_called = False

    def _numel(self, param: nn.Parameter) -> int:
        if param.dtype == torch.uint8:  # a 4-bit base, stored for FSDP in bf16
            return math.ceil(param.numel() / QUANT_STORAGE.itemsize)
        return param.numel()

    def _flat_view(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.dtype == torch.uint8:
            return torch.empty(self._numel(tensor), dtype=QUANT_STORAGE, device=tensor.device)
        return tensor.reshape(-1)

    # -- init_flat_param_attributes (lazy init, the root's first forward) -----------------------

    def lazy_init(self) -> None:
        run, n = self.emulation.run, self.emulation.world_size
        if self.offload:
            with run.host(pinned=True):
                self.cpu_grad = torch.zeros_like(self.local_shard, device=run.host_device)
        if self.uses_mp:
            self.mp_shard = torch.empty_like(
                self.local_shard, device=run.device, dtype=self.param_dtype
            )
            _free(self.mp_shard)
        if self.sharded:
            self.full = torch.empty(self.shard_numel * n, device=run.device, dtype=self.param_dtype)
            _free(self.full)
            if self.uses_mp:
                full_precision = torch.empty(
                    self.shard_numel * n, device=run.device, dtype=self.orig_dtype
                )
                _free(full_precision)

    # -- unshard / reshard -------------------------------------------------------------------------

    def needs_unshard(self) -> bool:
        assert self.full is not None or not self.sharded
        return self.sharded and not _allocated(self.full)  # type: ignore[arg-type]

    def unshard(self) -> None:
        """`_unshard`: pre_unshard, the all-gather, post_unshard."""
        run, n = self.emulation.run, self.emulation.world_size
        with run.on_stream(PRE_UNSHARD):
            self._pre_unshard()
        if not self.sharded:
            self._use_unsharded(self.flat.data)
            run.tag([self.flat.data], "parameters")
            return
        assert self.full is not None
        if self.needs_unshard():
            with run.on_stream(UNSHARD):
                _alloc(self.full, self.shard_numel * n)
            run.tag([self.full], "parameters")
            run.traffic.peer_bytes += self.shard_numel * self.full.element_size() * (n - 1)
        self._use_unsharded(self.full)
        if self.uses_mp:  # post_unshard
            assert self.mp_shard is not None
            _free(self.mp_shard)

    def _pre_unshard(self) -> None:
        """`pre_unshard`: the low-precision shard (or the offloaded shard's GPU copy)."""
        run = self.emulation.run
        if not (self.sharded and not self.offload and not self.needs_unshard()):
            if self.uses_mp:  # _use_low_precision_shard
                assert self.mp_shard is not None
                _alloc(self.mp_shard, self.local_shard.numel())
                source = self.local_shard
                if self.offload:
                    run.traffic.link_bytes += source.numel() * source.element_size()
                source = source.to(run.device, non_blocking=True)
                self.mp_shard.copy_(source)
                del source
                self.flat.data = self.mp_shard
            elif self.offload and self.flat.device != run.device:
                run.traffic.link_bytes += self.local_shard.numel() * self.local_shard.element_size()
                self.flat.data = self.local_shard.to(run.device, non_blocking=True)

    def _use_unsharded(self, padded: torch.Tensor) -> None:
        self.flat.data = padded[: self.numel]
        if self.state == "forward":  # _use_unsharded_views(as_params=False)
            self._set_views(self.flat)

    def _set_views(self, flat: torch.Tensor) -> None:
        views = [
            view.view(-1, 1) if packed else view.view(shape)
            for (_, _, shape, packed), view in zip(
                self.infos, torch.split(flat, self.numels), strict=True
            )
        ]
        for (module, name, _, _), view in zip(self.infos, views, strict=True):
            setattr(module, name, view)
        for module, name, index in self.shared:
            setattr(module, name, views[index])

    def reshard(self, free: bool) -> None:
        self.flat.data = self.local_shard  # _use_sharded_flat_param
        if free and self.full is not None:
            _free(self.full)
        if self.uses_mp and not self.sharded and self.mp_shard is not None:  # post_reshard
            _free(self.mp_shard)
        self.prefetched = False

    def free_in_backward(self) -> bool:
        return self.sharded

    # -- gradients ---------------------------------------------------------------------------------

    def post_backward(self, *_: Any) -> None:
        """`_post_backward_hook`: reshard, then reduce the unsharded flat gradient."""
        emulation = self.emulation
        run = emulation.run
        self.post_backward_called = True
        self.state = "backward_post"
        if self.flat.grad is None:
            return
        self.reshard(self.free_in_backward())
        emulation.prefetch(self)  # a no-op under BACKWARD_PRE
        with run.on_stream(POST_BACKWARD):
            self._reduce_gradient()

    def _reduce_gradient(self) -> None:
        """The rest of `_post_backward_hook`, on the post-backward stream: the gradient in the
        reduce dtype, reduced (reduce-scattered into a new shard, or all-reduced in place)."""
        run, n = self.emulation.run, self.emulation.world_size
        assert self.flat.grad is not None
        computed = self.flat.grad.data
        if self.flat.grad.dtype != self.reduce_dtype:
            self.flat.grad.data = self.flat.grad.to(self.reduce_dtype)
        if not self.sharded:  # _reduce_grad_no_shard: all-reduced in place, cast back
            grad = self.flat.grad
            if grad.dtype != self.flat.dtype:
                grad.data = grad.data.to(self.flat.dtype)
            self._offload(grad.data)
            del computed, grad
            return
        unsharded = self.flat.grad.data
        self.flat.grad = None
        padding = self.shard_numel * n - unsharded.numel()
        padded = F.pad(unsharded, [0, padding]) if padding > 0 else unsharded
        sharded = torch.empty(self.shard_numel, dtype=padded.dtype, device=run.device)
        run.traffic.peer_bytes += padded.numel() * padded.element_size() * (n - 1) // n
        if sharded.dtype != self.flat.dtype:  # _cast_grad_to_param_dtype
            sharded.data = sharded.data.to(self.flat.dtype)
        if self.has_saved_grad and self.saved_grad_shard is not None:
            self.saved_grad_shard += sharded
        else:
            self.saved_grad_shard = sharded
            self.has_saved_grad = True
        run.tag([self.saved_grad_shard], "gradients")
        self._offload(self.saved_grad_shard)
        del computed, unsharded, padded, sharded

    def _offload(self, grad: torch.Tensor) -> None:
        if self.cpu_grad is not None:
            run = self.emulation.run
            run.traffic.link_bytes += grad.numel() * grad.element_size()
            self.cpu_grad.copy_(grad.detach())

    def prepare_gradient_for_optim(self) -> None:
        if self.cpu_grad is not None:
            self.flat.grad = self.cpu_grad
        elif self.has_saved_grad and self.post_backward_called:
            self.flat.grad = self.saved_grad_shard
        self.saved_grad_shard, self.has_saved_grad = None, False
        self.post_backward_called = False


class Fsdp1Emulation:
    """Rank 0's memory under FSDP1 for `run`'s model: its hooks stay installed on the units."""

    def __init__(
        self, run: RunState, reshard_after_forward: bool, world_size: int, offload: bool
    ) -> None:
        self.run, self.world_size, self.offload = run, world_size, offload
        # NO_SHARD at one GPU keeps whatever it gathered; FULL_SHARD frees after forward.
        self.reshard_after_forward = reshard_after_forward and world_size > 1
        self.param_dtype = run.dtypes.autocast  # accelerate's MixedPrecision from mixed_precision
        self.post_forward_order: list[_Handle] = []
        self.callback_queued = False
        self.initialised = False
        units = fsdp1_units(run.model, run.preset)
        owner = {id(p): i for i, u in enumerate(units) for _, _, p in u.params}
        groups = [[owner[id(p)] for p in g["params"]] for g in run.optimizer.param_groups]
        for group in run.optimizer.param_groups:
            group["params"] = []
        self.handles = [_Handle(u, self, u.module is run.model) for u in units]
        self.root = self.handles[-1]
        # The optimizer steps the flat parameters that replace the weights it was built over.
        for group, indices in zip(run.optimizer.param_groups, groups, strict=True):
            group["params"] = [self.handles[i].flat for i in dict.fromkeys(indices)]
        for name, buffer in list(run.model.named_buffers()):  # the unit moves its buffers over
            module_name, _, leaf = name.rpartition(".")
            module = run.model.get_submodule(module_name)
            module._buffers[leaf] = moved = buffer.to(run.device, copy=True)
            run.tag([moved], "parameters")
        # All FSDP states in traversal order (the final callback's order): the root first.
        order = {id(m): i for i, m in enumerate(run.model.modules())}
        self.all_handles = sorted(self.handles, key=lambda h: order[id(h.unit.module)])
        for handle in self.handles:
            handle.unit.module.register_forward_pre_hook(
                self._hook(handle, self._pre_forward), with_kwargs=True
            )
            handle.unit.module.register_forward_hook(self._hook(handle, self._post_forward))
        if offload:
            step_on_host(run, run.optimizer)

    @staticmethod
    def _hook(handle: _Handle, method: Any) -> Any:
        return lambda module, *args: method(handle, *args)

    def _lazy_init(self) -> None:
        """The root's lazy init: each handle's attributes, and the buffers cast to the buffer
        dtype (MixedPrecision.buffer_dtype, accelerate's mixed precision dtype)."""
        self.initialised = True
        run, dtype = self.run, self.param_dtype
        for name in [n for n, _ in run.model.named_buffers()] if dtype else ():
            module_name, _, leaf = name.rpartition(".")
            module = run.model.get_submodule(module_name)
            buffer = module._buffers[leaf]
            if buffer is not None and buffer.is_floating_point() and buffer.dtype != dtype:
                module._buffers[leaf] = buffer = buffer.to(dtype)  # the old one freed at once
                run.tag([buffer], "parameters")
            del buffer
        for handle in self.all_handles:
            handle.lazy_init()

    # -- forward -----------------------------------------------------------------------------------

    def _pre_forward(self, handle: _Handle, args: Any, kwargs: Any) -> Any:
        if handle.is_root and not self.initialised:
            self._lazy_init()
        if handle.state == "backward_pre":  # a checkpointed block's recomputation
            return None
        handle.state = "forward"
        if not handle.prefetched:
            handle.unshard()
        if torch.is_grad_enabled() and handle.hook is None:
            if handle.flat.requires_grad:  # on the flat parameter's AccumulateGrad
                acc_grad = handle.flat.expand_as(handle.flat).grad_fn.next_functions[0][0]  # type: ignore[union-attr]
                handle.hook = (acc_grad, acc_grad.register_hook(handle.post_backward))
            else:  # a frozen unit reshards once its inputs' gradients exist
                inputs = [
                    t
                    for t in tree_flatten((args, kwargs))[0]
                    if isinstance(t, torch.Tensor) and t.requires_grad
                ]
                handle.hook = (
                    None,
                    torch.autograd.graph.register_multi_grad_hook(
                        inputs, lambda _: self._reshard_only(handle)
                    ),
                )
        return None

    def _reshard_only(self, handle: _Handle) -> None:
        handle.state = "backward_post"
        handle.reshard(handle.free_in_backward())
        self.prefetch(handle)

    def _post_forward(self, handle: _Handle, args: Any, output: Any) -> None:
        if handle.state == "backward_pre":
            return
        # record_post_forward (its quirk: index 0 is recorded again, as falsy)
        if handle.post_forward_index:
            self.post_forward_order.append(handle)
        else:
            handle.post_forward_index = len(self.post_forward_order)
            self.post_forward_order.append(handle)
        free = not handle.is_root and self.reshard_after_forward
        handle.reshard(free)
        if torch.is_grad_enabled():
            handle.needs_pre_backward_unshard = False
            handle.ran_pre_backward = False
            for tensor in tree_flatten(output)[0]:
                if isinstance(tensor, torch.Tensor) and tensor.requires_grad:
                    tensor.register_hook(lambda grad, h=handle: self._pre_backward(h, grad))
                    handle.needs_pre_backward_unshard = True
        handle.state = "idle"

    # -- backward ----------------------------------------------------------------------------------

    def _pre_backward(self, handle: _Handle, grad: torch.Tensor) -> torch.Tensor:
        if handle.ran_pre_backward:
            return grad
        if not self.callback_queued:
            self.callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._final_callback)
        handle.state = "backward_pre"
        if handle.needs_pre_backward_unshard and not handle.prefetched:
            handle.unshard()
        handle.needs_pre_backward_unshard = False
        self.prefetch(handle)
        handle.ran_pre_backward = True
        return grad

    def prefetch(self, current: _Handle) -> None:
        """BACKWARD_PRE: from a pre-backward hook, gather the unit that finished forward just
        before the current one."""
        if current.state != "backward_pre" or current.post_forward_index is None:
            return
        index = current.post_forward_index - 1
        if index < 0:
            return
        target = self.post_forward_order[index]
        if not target.needs_pre_backward_unshard or target.prefetched:
            return
        state, target.state = target.state, "backward_pre"
        target.unshard()
        target.state = state
        target.prefetched = True

    def _final_callback(self) -> None:
        """`_post_backward_final_callback`: reshard what is still gathered (the root), and put
        each sharded gradient in `.grad`."""
        for handle in self.all_handles:
            data, local = handle.flat.data, handle.local_shard
            resharded = (
                data.untyped_storage()._cdata == local.untyped_storage()._cdata
                and data.storage_offset() == local.storage_offset()
            )
            if not resharded:
                handle.reshard(handle.free_in_backward())
            if handle.flat.requires_grad:
                handle.prepare_gradient_for_optim()
            if handle.hook is not None:  # registered again in the next forward
                handle.hook[1].remove()
                handle.hook = None
            handle.state = "idle"
            handle.ran_pre_backward = False
            handle.needs_pre_backward_unshard = False
            handle.post_forward_index = None
            handle.prefetched = False
        self.post_forward_order.clear()
        self.callback_queued = False
