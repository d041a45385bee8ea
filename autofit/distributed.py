"""A process group of one, for the probes that run a sharding library for real (DeepSpeed ZeRO,
FSDP2) in one process.

The group meets in an in-memory store, not over TCP: a fixed MASTER_PORT would make two probes
running at once (a search with jobs=2, two tests) fail with EADDRINUSE, and a group of one has no
peer to reach anyway.
"""

from __future__ import annotations

import torch


def join_group_of_one(device: torch.device) -> None:
    """Initialise torch.distributed with this process as the whole world (a no-op when it is
    already initialised): NCCL on a GPU, gloo on the CPU."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
