"""PyTorch FSDP1 itself (`FullyShardedDataParallel`) on a run's model, for the `cpu` and `cuda`
backends, wrapped as the emulation (autofit/emulations/fsdp1.py) lays it out; tests/test_fsdp1.py
compares the two.

Known limitations: a probe runs it in a group of one process, where FSDP1 runs NO_SHARD whatever
the `fsdp` value (FULL_SHARD and SHARD_GRAD_OP are measured only in tests, in a fake group whose
collectives move nothing). `fsdp_offload=cpu` is passed on as `CPUOffload(offload_params=True)`
but runs only on a GPU (its pinned shards), where no test holds it to the emulation yet.
`sync_module_states`, which the accelerate export sets, is not (its broadcast of the states in
250 MiB buckets at wrap time is not measured). 4-bit bases are refused on the real backends (FSDP1
cannot flatten their uint8 weights with bf16 norms)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from autofit.distributed import fake_group, join_group_of_one
from autofit.emulations.fsdp1_units import fsdp1_units

if TYPE_CHECKING:
    from autofit.run_state import RunState


def shard_fsdp1_for_real(run: RunState, reshard_after_forward: bool, group: Any = None) -> None:
    """FullyShardedDataParallel over `run`'s model as accelerate wraps it (the units above,
    BACKWARD_PRE, limit_all_gathers, use_orig_params=False, MixedPrecision from the precision
    knob, CPUOffload from fsdp_offload), in `group` (default: a group of one, where FSDP1 runs NO_SHARD: NCCL's on a GPU, on the
    CPU a fake one, `fake_group`). `run.model` stays the
    model (the run owns the field), its calls go through the root wrapper, and the optimizer
    steps the flat parameters registered on it and on each unit."""
    from torch.distributed.fsdp import (
        BackwardPrefetch,
        CPUOffload,
        MixedPrecision,
        ShardingStrategy,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.utils._python_dispatch import _disable_current_modes

    if group is None and run.device.type == "cpu":
        group = fake_group(1)  # a group of one computes nothing, and needs no gloo threads
    elif group is None:
        with _disable_current_modes():
            join_group_of_one(run.device)
    model = run.model
    units = fsdp1_units(model, run.preset)
    wrapped = {id(u.module) for u in units if u.module is not model}
    owner = {id(p): u.module for u in units for _, _, p in u.params}
    groups = [[owner[id(p)] for p in g["params"]] for g in run.optimizer.param_groups]
    for param_group in run.optimizer.param_groups:
        param_group["params"] = []
    for u in units:
        u.params.clear()
    dtype = run.dtypes.autocast
    policy = (
        MixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype) if dtype else None
    )
    strategy = (
        ShardingStrategy.FULL_SHARD if reshard_after_forward else ShardingStrategy.SHARD_GRAD_OP
    )
    wrapper = FSDP(
        model,
        process_group=group,
        sharding_strategy=strategy,
        auto_wrap_policy=lambda module, recurse, nonwrapped_numel: recurse or id(module) in wrapped,
        mixed_precision=policy,
        cpu_offload=CPUOffload(offload_params=run.knobs.get("fsdp_offload") == "cpu"),
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
        limit_all_gathers=True,
        use_orig_params=False,
        device_id=run.device,
    )
    _call_through(model, wrapper)
    for param_group, modules in zip(run.optimizer.param_groups, groups, strict=True):
        param_group["params"] = [m._flat_param for m in dict.fromkeys(modules)]
    # The model was built in host memory (the fsdp knob's build_context); where the device is
    # the host's own (the cpu backend) FSDP1 moves nothing, so the buffers are copied out of host
    # memory here, as onto a GPU.
    for name, buffer in list(model.named_buffers()):
        if buffer.device == run.host_device:
            module_name, _, leaf = name.rpartition(".")
            module = model.get_submodule(module_name)
            module._buffers[leaf] = buffer.to(run.device, copy=True)
    run.tag(list(model.parameters()), "parameters")
    run.tag(list(model.buffers()), "parameters")
    # After the root's lazy init has cast the buffers to the buffer dtype (new tensors), and
    # after each unit's FSDP pre-forward has gathered its flat parameter (a storage resized to
    # nothing and back keeps its category in the tracker).
    model.register_forward_pre_hook(lambda m, _: run.tag(list(m.buffers()), "parameters"))
    for unit in units:
        unit.module.register_forward_pre_hook(
            lambda m, _: run.tag(
                [m._flat_param] if "_flat_param" in m._parameters else [], "parameters"
            )
        )


def _call_through(model: nn.Module, wrapper: nn.Module) -> None:
    """Calls of `model` run the root FSDP wrapper, which calls the model itself back."""
    base = type(model)

    def call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if self.__dict__.get("_autofit_in_fsdp"):
            return base.__call__(self, *args, **kwargs)
        self.__dict__["_autofit_in_fsdp"] = True
        try:
            return wrapper(*args, **kwargs)
        finally:
            self.__dict__["_autofit_in_fsdp"] = False

    model.__class__ = type(base.__name__, (base,), {"__call__": call})
