"""PyTorch FSDP2 itself (`fully_shard`) on a run's model, for the `cpu` and `cuda` backends, in a
one-process group, over the groups the emulation (autofit/emulations/fsdp.py) lays out;
tests/test_fsdp.py compares the two.

Known limitations: in a group of one each shard is the whole weight and the collectives move
nothing between GPUs, so a world size beyond one is the emulation's alone; the mesh's and the
process group's own bookkeeping is made unseen by the tracker. The backends' rules refuse what
it cannot run: `fsdp_offload=cpu` on the cpu backend (pinned host memory needs a GPU),
bitsandbytes' 4-bit bases (uint8 weights `fully_shard` cannot shard) and optimizers other than
torch's AdamW and SGD (the DTensor parameters)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autofit.distributed import join_group_of_one
from autofit.emulations.fsdp_groups import fsdp_groups

if TYPE_CHECKING:
    from autofit.run_state import RunState


def shard_for_real(run: RunState, reshard_after_forward: bool) -> None:
    """`fully_shard` on `run`'s model in a one-process group (gloo on the CPU, NCCL on a GPU),
    over the groups accelerate makes, with accelerate's mixed-precision policy; the optimizer
    built before it is pointed at the sharded (DTensor) parameters that replace the originals."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )
    from torch.utils._python_dispatch import _disable_current_modes

    # The process group and the mesh keep their bookkeeping (the mesh's rank tensor) on the CPU
    # as a library's own, which on a GPU run no ledger counts: made unseen by the tracker, or
    # the cpu backend (where the CPU is the device) would count them as GPU memory.
    with _disable_current_modes():
        join_group_of_one(run.device)
        mesh = init_device_mesh(run.device.type, (1,))
    dtype = run.dtypes.autocast
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype)
    offload = CPUOffloadPolicy() if run.knobs["fsdp_offload"] == "cpu" else OffloadPolicy()
    # The optimizer built before sharding is pointed at the sharded (DTensor) parameters that
    # replace the originals. Until then it holds names, not the originals: fully_shard frees a
    # group's unsharded weights when it returns (_fsdp_param.py, _init_sharded_param), and a
    # reference kept here would hold every group's until all are sharded.
    names = {id(p): name for name, p in run.model.named_parameters()}
    optimized = [[names[id(p)] for p in group["params"]] for group in run.optimizer.param_groups]
    for param_group in run.optimizer.param_groups:
        param_group["params"] = []
    groups = fsdp_groups(run.model, run.preset, reshard_after_forward)
    for group in groups:
        group.params.clear()  # fully_shard takes the modules; their weights it replaces
    for group in groups:
        modules = group.modules if len(group.modules) > 1 else group.modules[0]
        # The root's None: FSDP2's own choice for the root, never resharded after forward.
        reshard = group.reshard_after_forward if group.modules[0] is not run.model else None
        fully_shard(
            modules,
            mesh=mesh,
            reshard_after_forward=reshard,
            mp_policy=policy,
            offload_policy=offload,
        )
    # The model was built in host memory (the knob's build_context) and fully_shard placed each
    # shard, and each group's buffers, on its device; where that device is the host's own (the
    # cpu backend) the buffers are copied out of host memory here, as onto a GPU.
    for name, buffer in list(run.model.named_buffers()):
        if buffer.device == run.host_device:
            module_name, _, leaf = name.rpartition(".")
            module = run.model.get_submodule(module_name)
            module._buffers[leaf] = buffer.to(run.device, copy=True)
    run.tag(list(run.model.buffers()), "parameters")
    after = dict(run.model.named_parameters())
    for param_group, group_names in zip(run.optimizer.param_groups, optimized, strict=True):
        param_group["params"] = [after[name] for name in group_names]
    run.tag(list(run.model.parameters()), "parameters")  # the tracker counts a DTensor's local
    for group in groups:
        for module in group.modules:
            # After FSDP2's own pre-forward hook (prepended) has gathered the group: its weights
            # are the gathered ones now. A weight freed by resizing its storage and gathered
            # back keeps this category (the tracker), as the emulation's gathered weights have.
            module.register_forward_pre_hook(
                lambda module, _args: run.tag(list(module.parameters()), "parameters")
            )
