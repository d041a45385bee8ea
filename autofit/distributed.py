"""Process groups for the probes that run a sharding library for real (DeepSpeed ZeRO, FSDP1,
FSDP2) in one process.

The group meets in an in-memory store, not over TCP: a fixed MASTER_PORT would make two probes
running at once (a search with jobs=2, two tests) fail with EADDRINUSE, and a group of one has no
peer to reach anyway.
"""

from __future__ import annotations

from typing import Any

import torch


def join_group_of_one(device: torch.device) -> None:
    """Initialise torch.distributed with this process as the whole world (a no-op when it is
    already initialised): NCCL on a GPU, gloo on the CPU."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def fake_group(world: int) -> Any:
    """A process group of `world` ranks in this one process whose collectives do nothing (torch's
    FakeProcessGroup): what a group of one computes, and what each rank of a larger one holds.

    The cpu backend runs FSDP1 in one (world=1) rather than in the gloo group above: gloo runs
    each collective on a worker thread of its own, and with it the allocation log of the real
    step (tests/test_fsdp1.py) differed from the emulation's by one free's place in about one
    run in ten on two busy cores, most likely a tensor that thread held let go early or late;
    none in forty without it."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import FakeProcessGroup, ProcessGroup

    group = ProcessGroup(dist.HashStore(), 0, world)
    kind = ProcessGroup.BackendType.CUSTOM
    group._set_default_backend(kind)
    group._register_backend(torch.device("cpu"), kind, FakeProcessGroup._create_internal(0, world))
    return group
