"""ZeRO-3's gathered weights over a step: DeepSpeed's parameter coordinator, emulated.

Known limitations: not modelled are NVMe prefetching of shares, ZeRO++'s quantized or
hierarchical gathers, `model_persistence_threshold` (unbounded by default), leaf modules
(`set_z3_leaf_modules`), `__params_to_release`'s cache across steps (the steps traced are alike)
and `register_external_parameter` (a read through a module's `_parameters` is followed, as
DeepSpeed follows it). Held against DeepSpeed in one process; with N > 1 the gathers' buffers
follow partition_parameters.py unmeasured, and NCCL's own buffers are not counted.

Follows DeepSpeed 0.19 (deepspeed/runtime/zero/parameter_offload.py, which hooks every module,
and partitioned_param_coordinator.py, which decides what is gathered); `GatherCoordinator` keeps
its names and order of events, so that one rank holds the same weights gathered at every moment
(tests/test_zero3_live_params.py holds the two side by side on DeepSpeed itself):

- every module, parameterless ones too, is hooked as DeepSpeed hooks it: before its forward its
  own weights are gathered (`fetch`), after it they may be released (`release`); an autograd
  function on its outputs gathers them again when their gradient arrives, and one on its inputs
  releases them once the gradients of all inputs that need one are made. A module none of whose
  inputs needs a gradient (the first layers under LoRA) is never released in backward: its weights
  stay gathered until backward ends (`release_backward_leftovers`);
- the first step records the modules in the order they are fetched (forward, recomputation under
  gradient checkpointing, backward); from the second step on that trace drives prefetching: each
  fetch also starts gathering the weights next in the trace, up to `prefetch_bucket` elements
  (the bucket is filled while under it, so the last weight may overshoot) and no further than
  `max_live` elements gathered in all;
- with a trace, a module's weights are not released if they are used again within
  `max_reuse_distance` elements of weights further along the trace (so the last layers' weights
  stay from forward into their backward), nor if a prefetch already passed over their next use;
- weights of at most `persistence_threshold` elements (norms, biases) stay gathered from their
  first use until the optimizer's step, once a trace exists;
- under gradient checkpointing a frozen weight gathered by a recomputed forward belongs to the
  module whose backward is running, and is released with it;
- the optimizer's step starts by releasing everything, and ends by gathering the persistent
  weights again: they stay gathered through every later step.

Memory of a gather on N > 1 ranks (partition_parameters.py): a weight gathered alone gets a
buffer of its padded size; several at once (a module's, a prefetch bucket) one flat buffer, each
copied out when first waited for, the buffer living until all are. On one rank a weight whose
share is on the GPU is that share.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
from torch import nn

# DeepSpeed's defaults (deepspeed/runtime/zero/config.py), in elements.
PREFETCH_BUCKET = 50_000_000
MAX_LIVE_PARAMETERS = 1_000_000_000
MAX_REUSE_DISTANCE = 1_000_000_000
PERSISTENCE_THRESHOLD = 100_000


@dataclass(frozen=True)
class LiveParams:
    """ZeRO-3's settings for what stays gathered (`stage3_*` in DeepSpeed's config)."""

    prefetch_bucket: int = PREFETCH_BUCKET
    max_live: int = MAX_LIVE_PARAMETERS
    max_reuse_distance: int = MAX_REUSE_DISTANCE
    persistence_threshold: int = PERSISTENCE_THRESHOLD


class Status(Enum):
    NOT_AVAILABLE = 1
    INFLIGHT = 2
    AVAILABLE = 3


class Trace(Enum):
    RECORD = 1
    COMPLETE = 2
    INVALID = 3


# Gathers a group of weights; returns, per weight, a function that completes its gather (the
# handle's wait) and gives its gathered data.
Gather = Callable[[list[nn.Parameter]], dict[nn.Parameter, Callable[[], torch.Tensor]]]


class GatherCoordinator:
    """DeepSpeed's PartitionedParameterCoordinator and its module hooks over `model`.
    `numel(param)` is a weight's element count as DeepSpeed partitions it (`ds_numel`);
    `gather` gathers weights, `release(param)` frees a gathered weight back to its share."""

    def __init__(
        self,
        model: nn.Module,
        settings: LiveParams,
        numel: Callable[[nn.Parameter], int],
        gather: Gather,
        release: Callable[[nn.Parameter], None],
    ) -> None:
        self.settings, self.gather, self.release_data = settings, gather, release
        self.modules = list(model.modules())  # ds_id: preorder, as _register_deepspeed_module
        self.ids = {module: index for index, module in enumerate(self.modules)}
        self.order = {param: index for index, param in enumerate(model.parameters())}
        self.numel = {param: numel(param) for param in self.order}
        self.persist = {p for p, n in self.numel.items() if n <= settings.persistence_threshold}
        self.status = dict.fromkeys(self.order, Status.NOT_AVAILABLE)
        self.active: dict[nn.Parameter, set[int]] = {p: set() for p in self.order}
        self.inflight: dict[nn.Parameter, Callable[[], torch.Tensor]] = {}
        self.recompute: dict[nn.Module, set[nn.Parameter]] = collections.defaultdict(set)
        self.active_backward: dict[int, nn.Module] = {}
        self.trace = Trace.INVALID
        self.submodule_order: list[nn.Module] = []
        self.param_order: list[tuple[nn.Parameter, int]] = []
        self.fetched_at: dict[int, collections.deque[int]] = collections.defaultdict(
            collections.deque
        )
        self.queue: collections.deque[tuple[nn.Parameter, int]] = collections.deque()
        self.most_recent: dict[nn.Parameter, int] = collections.defaultdict(lambda: -(10**10))
        self.step_id = 0
        self.n_available = 0
        self.listeners: list[Callable[[str], None]] = []  # told after each event (tests)
        self.pre_backward_count: dict[nn.Module, int] = collections.defaultdict(int)
        self.grads_remaining: dict[nn.Module, int] = collections.defaultdict(int)
        # A weight read in the model's forward outside its module's (a LoRA layer reading its
        # adapter's dtype) is gathered then and becomes the running module's own from then on
        # (ZeROOrderedDict, register_external_parameter).
        self.external: dict[nn.Module, dict[int, nn.Parameter]] = collections.defaultdict(dict)
        self.stack: list[nn.Module] = [model]  # FWD_MODULE_STACK
        self.in_forward = False  # the engine's forward (not a recomputation in backward)

        def start(*_: Any) -> None:
            self.in_forward = True
            self.reset_step()

        model.register_forward_pre_hook(start)
        for module in self.modules:
            module._parameters = _Watched(self, module._parameters)
            self._hook(module)
        model.register_forward_hook(lambda *_: setattr(self, "in_forward", False))

    def own(self, module: nn.Module) -> list[nn.Parameter]:
        """The weights a module gathers: its own and those registered to it (iter_params)."""
        return list(module.parameters(recurse=False)) + list(self.external[module].values())

    def read(self, param: nn.Parameter) -> None:
        """A weight read through its module's attribute (ZeROOrderedDict.__getitem__)."""
        if self.in_forward and self.status.get(param) == Status.NOT_AVAILABLE:
            self.external[self.stack[-1]][id(param)] = param
            self.status[param] = Status.INFLIGHT  # param.all_gather(): not counted as live
            self._wait(param, self.gather([param])[param])

    def gathered_numel(self) -> int:
        """Elements of the weights gathered or being gathered now, whole."""
        return sum(self.numel[p] for p, s in self.status.items() if s != Status.NOT_AVAILABLE)

    def _tell(self, event: str) -> None:
        for listener in self.listeners:
            listener(event)

    # -- hooks (parameter_offload.py) -------------------------------------------------------------

    def _hook(self, module: nn.Module) -> None:
        coordinator = self

        class PreBackward(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, output: torch.Tensor) -> torch.Tensor:
                coordinator.pre_backward_count[module] += 1
                return output.detach()

            @staticmethod
            def backward(ctx: Any, *grads: Any) -> Any:
                if coordinator.pre_backward_count[module] > 0:
                    coordinator.before(module, forward=False)
                    coordinator.pre_backward_count[module] -= 1
                return grads

        class PostBackward(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, value: torch.Tensor) -> torch.Tensor:
                ctx.counted = value.requires_grad
                if value.requires_grad:
                    coordinator.grads_remaining[module] += 1
                return value.detach()

            @staticmethod
            def backward(ctx: Any, *grads: Any) -> Any:
                coordinator.grads_remaining[module] -= 1
                if ctx.counted and coordinator.grads_remaining[module] == 0:
                    coordinator.release(module, forward=False)
                return grads

        def before_forward(_: nn.Module, args: Any) -> None:
            self.stack.append(module)
            self.before(module, forward=True)

        def after_forward(_: nn.Module, args: Any, output: Any) -> None:
            self.stack.pop()
            self.release(module, forward=True)

        def outputs_gather_in_backward(_: nn.Module, args: Any, output: Any) -> Any:
            return _to_tensors(PreBackward.apply, output)

        def inputs_release_in_backward(_: nn.Module, args: Any) -> Any:
            self.grads_remaining[module] = 0
            return _to_tensors(PostBackward.apply, args)

        # In DeepSpeed's order: forward pre-hooks fetch, then wrap the inputs; forward hooks
        # release, then wrap the outputs.
        module.register_forward_pre_hook(before_forward)
        module.register_forward_hook(after_forward)
        module.register_forward_hook(outputs_gather_in_backward)
        module.register_forward_pre_hook(inputs_release_in_backward)

    def before(self, module: nn.Module, forward: bool) -> None:
        """Before a module's forward or backward (pre_sub_module_*_function)."""
        self.trace_prologue(module)
        if self.trace == Trace.RECORD:
            self.record_module(module)
        self.fetch(module, forward)

    # -- tracing -------------------------------------------------------------------------------

    def trace_prologue(self, module: nn.Module) -> None:
        if self.trace != Trace.COMPLETE:
            return
        if (
            len(self.submodule_order) <= self.step_id
            or module is not self.submodule_order[self.step_id]
        ):
            self._invalidate_trace()

    def _invalidate_trace(self) -> None:
        self.trace = Trace.INVALID
        self.submodule_order, self.param_order = [], []
        self.most_recent = collections.defaultdict(lambda: -(10**10))
        self.fetched_at = collections.defaultdict(collections.deque)
        self.queue = collections.deque()
        self._clean_inflight()

    def record_module(self, module: nn.Module) -> None:
        self.submodule_order.append(module)
        self.fetched_at[self.ids[module]].append(self.step_id)

    def _clean_inflight(self) -> None:
        for param, wait in list(self.inflight.items()):
            self._wait(param, wait)
            self._release_param(param)
        self.inflight.clear()

    def reset_step(self) -> None:
        """At the model's forward: a recorded trace becomes the plan, or recording starts."""
        self._clean_inflight()
        if self.trace != Trace.COMPLETE:
            if self.trace == Trace.RECORD:
                self.param_order = []
                for module in self.submodule_order:
                    step_id = self.fetched_at[self.ids[module]].popleft()
                    for param in sorted(set(self.own(module)), key=self.order.__getitem__):
                        self.param_order.append((param, step_id))
                self.trace = Trace.COMPLETE
            else:
                self.trace = Trace.RECORD
        self.queue = collections.deque(self.param_order)
        self.most_recent = collections.defaultdict(lambda: -(10**10))
        self.fetched_at = collections.defaultdict(collections.deque)
        self.step_id = 0
        self.n_available = 0

    # -- fetch and release ---------------------------------------------------------------------

    def fetch(self, module: nn.Module, forward: bool) -> None:
        if not forward:
            self.active_backward[self.ids[module]] = module
        params = set(self.own(module))
        self._all_gather(params)
        recomputing = forward and torch._C._current_graph_task_id() != -1
        for param in sorted(params, key=self.order.__getitem__):
            self.active[param].add(self.ids[module])
            if recomputing and self.active_backward and not param.requires_grad:
                owner = next(reversed(self.active_backward.values()))
                self.recompute[owner].add(param)
                self.active[param].add(self.ids[owner])
            if param in self.inflight:
                self._wait(param, self.inflight.pop(param))
        if self.trace == Trace.COMPLETE:
            self._prefetch(params)
        self.step_id += 1
        self._tell("fetch")

    def _prefetch(self, params: set[nn.Parameter]) -> None:
        pending = {p for p in params if self.most_recent[p] < self.step_id}
        popped: set[nn.Parameter] = set()
        while self.queue and len(popped) < len(pending):
            param, step_id = self.queue.popleft()
            self.most_recent[param] = step_id
            popped.add(param)
        assert popped == pending, "the module order departs from the recorded trace"
        if self.settings.prefetch_bucket <= 0:
            return
        limit = min(self.settings.max_live - self.n_available, self.settings.prefetch_bucket)
        ahead: set[nn.Parameter] = set()
        numel = 0
        while self.queue and numel < limit:
            param, step_id = self.queue.popleft()
            if self.status[param] == Status.NOT_AVAILABLE and param not in ahead:
                ahead.add(param)
                numel += self.numel[param]
            self.most_recent[param] = max(self.most_recent[param], step_id)
        if ahead:
            self._all_gather(ahead)

    def _all_gather(self, params: Iterable[nn.Parameter]) -> None:
        group = sorted(
            (p for p in params if self.status[p] == Status.NOT_AVAILABLE),
            key=self.order.__getitem__,
        )
        if not group:
            return
        self.n_available += sum(self.numel[p] for p in group)
        for param in group:
            self.status[param] = Status.INFLIGHT
        self.inflight.update(self.gather(group))

    def _wait(self, param: nn.Parameter, wait: Callable[[], torch.Tensor]) -> None:
        param.data = wait()
        self.status[param] = Status.AVAILABLE

    def _params_to_release(self, module: nn.Module) -> set[nn.Parameter]:
        own = self.own(module)
        if self.trace != Trace.COMPLETE:
            return set(own)
        candidates = {
            p for p in own if p not in self.persist and self.most_recent[p] <= self.step_id
        }
        traversed = 0
        for later in self.submodule_order[self.step_id :]:
            if traversed >= self.settings.max_reuse_distance:
                break
            for param in self.own(later):
                candidates.discard(param)
                traversed += self.numel[param]
        return candidates

    def release(self, module: nn.Module, forward: bool) -> None:
        to_release = self._params_to_release(module)
        params = set(self.own(module))
        if not forward:
            recomputed = self.recompute.pop(module, set())
            to_release |= {p for p in recomputed if p not in self.persist}
            params |= recomputed
            self.active_backward.pop(self.ids[module], None)
        for param in sorted(params, key=self.order.__getitem__):
            self.active[param].discard(self.ids[module])
            if param in to_release:
                self._release_param(param)
        self._tell("release")

    def release_backward_leftovers(self) -> None:
        """After backward: modules whose inputs needed no gradient were never released."""
        while self.active_backward:
            _, module = self.active_backward.popitem()
            params = set(self.own(module)) | self.recompute.pop(module, set())
            for param in sorted(params, key=self.order.__getitem__):
                self.active[param].discard(self.ids[module])
                if param not in self.persist:
                    self._release_param(param)
        self._tell("leftovers")

    def release_all(self) -> None:
        """The optimizer's step: every weight back to its share, persistent ones too."""
        for param in self.order:
            if param in self.inflight:
                self._wait(param, self.inflight.pop(param))
            self.active[param].clear()
            self._release_param(param)
        self._tell("release_all")

    def gather_persistent(self) -> None:
        """After the optimizer's step (stage3.py `_post_step`): the persistent weights gathered
        again, all at once, outside the coordinator's count; they stay for the next step."""
        group = sorted(
            (p for p in self.persist if self.status[p] == Status.NOT_AVAILABLE),
            key=self.order.__getitem__,
        )
        if group:
            for param, wait in self.gather(group).items():
                self._wait(param, wait)

    def _release_param(self, param: nn.Parameter) -> None:
        if self.status[param] == Status.AVAILABLE and not self.active[param]:
            self.release_data(param)
            self.status[param] = Status.NOT_AVAILABLE
            self.n_available -= self.numel[param]


class _Watched(dict):  # type: ignore[type-arg]
    """A module's `_parameters`, telling the coordinator of each weight read."""

    def __init__(self, coordinator: GatherCoordinator, params: dict[str, Any]) -> None:
        super().__init__(params)
        self.coordinator = coordinator

    def __getitem__(self, key: str) -> Any:
        param = super().__getitem__(key)
        if param is not None:
            self.coordinator.read(param)
        return param


def _to_tensors(function: Callable[[torch.Tensor], torch.Tensor], value: Any) -> Any:
    """DeepSpeed's apply_to_tensors_only: `function` on every tensor in `value`."""
    if isinstance(value, (tuple, list)):
        touched = [_to_tensors(function, item) for item in value]
        if hasattr(value, "_fields"):  # a namedtuple
            return value.__class__(*touched)
        return value.__class__(touched)
    if isinstance(value, dict):
        for key in value.keys():
            value[key] = _to_tensors(function, value[key])
        return value
    if isinstance(value, torch.Tensor):
        return function(value)
    return value


@dataclass(frozen=True)
class Layout:
    """How one weight is partitioned: its share's elements and dtype, whether the share is on the
    GPU, and the weight's own shape and dtype once gathered."""

    share_numel: int
    share_dtype: torch.dtype
    on_gpu: bool
    shape: torch.Size
    dtype: torch.dtype


def gathered_buffers(
    group: list[nn.Parameter],
    world_size: int,
    layout: Callable[[nn.Parameter], Layout],
    share_of: Callable[[nn.Parameter], torch.Tensor],
    device: torch.device,
) -> dict[nn.Parameter, Callable[[], torch.Tensor]]:
    """The memory of one all-gather of `group` (partition_parameters.py): on one rank, each
    weight's share as it is, or copied to the GPU (NoGatherHandle); one weight alone into a
    padded buffer it keeps (`_all_gather_sequential`); several into one flat buffer per dtype,
    each copied out when first waited for (`AllGatherCoalescedHandle.wait`), the flat buffer kept
    until all have been."""
    if world_size == 1:
        return {param: _local(layout(param), share_of(param), device) for param in group}
    if len(group) == 1:
        (param,) = group
        shape = layout(param)
        buffer = torch.empty(shape.share_numel * world_size, dtype=shape.share_dtype, device=device)
        return {param: lambda: _as_full(buffer, shape)}
    waits: dict[nn.Parameter, Callable[[], torch.Tensor]] = {}
    by_dtype: dict[torch.dtype, list[nn.Parameter]] = collections.defaultdict(list)
    for param in group:
        by_dtype[layout(param).share_dtype].append(param)
    for dtype, params in by_dtype.items():
        size = sum(layout(p).share_numel for p in params) * world_size
        waits.update(_coalesced([layout(p) for p in params], params, size, dtype, device))
    return waits


def _coalesced(
    layouts: list[Layout],
    params: list[nn.Parameter],
    size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> dict[nn.Parameter, Callable[[], torch.Tensor]]:
    flat: list[torch.Tensor] = [torch.empty(size, dtype=dtype, device=device)]
    copies: dict[nn.Parameter, torch.Tensor] = {}
    waited: set[nn.Parameter] = set()

    def wait(param: nn.Parameter) -> torch.Tensor:
        if not waited:  # the first wait copies every weight out of the flat buffer
            for each, shape in zip(params, layouts, strict=True):
                copies[each] = torch.empty(shape.shape, dtype=shape.dtype, device=device)
        waited.add(param)
        if len(waited) == len(params):
            flat.clear()  # the handle is gone from the registry: its buffer is freed
        return copies.pop(param)

    return {param: (lambda p=param: wait(p)) for param in params}


def _local(shape: Layout, shard: torch.Tensor, device: torch.device) -> Callable[[], torch.Tensor]:
    if shape.on_gpu:
        return lambda: _as_full(shard, shape)
    return lambda: torch.empty(shape.shape, dtype=shape.dtype, device=device)


def _as_full(buffer: torch.Tensor, shape: Layout) -> torch.Tensor:
    flat = buffer.view(shape.dtype) if buffer.dtype != shape.dtype else buffer
    return flat[: math.prod(shape.shape)].view(shape.shape)
