"""ZeRO-Infinity's NVMe offload, laid out as DeepSpeed 0.19 lays it out, for ZeroEmulation.

Known limitations: it is never run for real (DeepSpeed's swap needs its async I/O op and a
drive), so nothing here is held against DeepSpeed but its source:

- The settings are DeepSpeed's defaults: `aio` (intra_op_parallelism 1, hence 1 KiB alignment),
  `buffer_count`, `sub_group_size` and `max_in_cpu` are not read, and only `buffer_size` follows
  the largest share; the pipelined swapper (`pipeline_read`/`pipeline_write`) is not modelled.
- The pinned write-back buffer DeepSpeed reserves when trained shares overflow `max_in_cpu` onto
  the drive (stage3.py, `reserve_partitioned_swap_space`) is not allocated.
- The drive is bytes read and written, timed at the GPU entry's NVMe rate: its free space (the
  swap files under `nvme_path`) is not checked.

The states on the drive take no memory; what they cost is the host's pinned buffers they pass
through, and the bytes read and written. DeepSpeed's defaults (deepspeed/runtime/zero/
offload_config.py, zero/config.py) and rules (zero/stage3.py, swap_tensor/):

- The optimizer state is split into sub-groups: this rank's shares in order, a group closing once
  it holds `sub_group_size` (1e9) elements (stage3.py, `_create_fp16_sub_groups`). A sub-group
  goes to the drive only if its fp32 bytes reach 1 MiB (`MIN_AIO_BYTES`, swap_tensor/utils.py;
  `_swappable_optimizer_subgroup`); smaller ones stay in host memory as ZeRO-Offload keeps them
  (a LoRA's adapters often do). The swapper pins `buffer_count` (4: master weights, gradients and
  the two moments) buffers of the largest sub-group's elements, aligned to 1 KiB
  (optimizer_utils.py, `SwapBufferManager`), whether or not any sub-group is swapped.
- Gradients are written to the drive as backward makes them; the step reads each sub-group's
  master weights, moments and gradients into the buffers, updates them, and writes the three
  states back (no pipelining by default: `pipeline_read`/`pipeline_write` false).
- Weights (`offload_param.device: nvme`): each share is read into one of `buffer_count` (5)
  pinned buffers of `buffer_size` (1e8) 16-bit elements when its module gathers it
  (partitioned_param_swapper.py); the trained weights' shares, up to `max_in_cpu` (1e9) elements,
  stay in pinned host memory instead (stage3.py, `_create_param_groups_fp16_flat_cpu_memory`).
  A share larger than a buffer does not fit one: the export's `buffer_size` must hold the largest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from autofit.run_state import RunState

OPTIMIZER_BUFFER_COUNT = 4  # offload_optimizer.buffer_count
PARAM_BUFFER_COUNT = 5  # offload_param.buffer_count
PARAM_BUFFER_SIZE = 100_000_000  # offload_param.buffer_size, in elements
PARAM_MAX_IN_CPU = 1_000_000_000  # offload_param.max_in_cpu, in elements
SUB_GROUP_SIZE = 1_000_000_000  # zero_optimization.sub_group_size, in elements
MIN_AIO_BYTES = 1 << 20  # a smaller optimizer sub-group is not swapped
AIO_ALIGNED_BYTES = 1024  # buffers are whole multiples of this (aio intra_op_parallelism 1)
FP32 = 4


def aligned(numel: int, element_size: int) -> int:
    """`numel` rounded up to whole 1 KiB I/O blocks of `element_size`-byte elements."""
    step = AIO_ALIGNED_BYTES // element_size
    return -(-numel // step) * step


def sub_groups(shares: list[int], size: int = SUB_GROUP_SIZE) -> list[list[int]]:
    """The indices of the shares in each optimizer sub-group, in order."""
    groups: list[list[int]] = []
    current: list[int] = []
    count = 0
    for index, numel in enumerate(shares):
        current.append(index)
        count += numel
        if count >= size or index == len(shares) - 1:
            groups.append(current)
            current, count = [], 0
    return groups


class OptimizerSwap:
    """The optimizer sub-groups on NVMe and the pinned buffers they pass through."""

    def __init__(self, run: RunState, shares: list[int]) -> None:
        self.run = run
        self.groups = sub_groups(shares)
        sizes = [sum(shares[i] for i in group) for group in self.groups]
        self.swapped_groups = [
            (group, size) for group, size in zip(self.groups, sizes, strict=True)
            if size * FP32 >= MIN_AIO_BYTES
        ]  # fmt: skip
        self.swapped = {i for group, _ in self.swapped_groups for i in group}
        self.where: dict[int, int] = {}  # share index -> offset within its sub-group
        for group in self.groups:
            offset = 0
            for index in group:
                self.where[index] = offset
                offset += shares[index]
        self.shares = shares
        largest = aligned(max(sizes), FP32)
        with run.host(pinned=True):
            self.buffers = [
                torch.zeros(largest, dtype=torch.float32, device=run.host_device)
                for _ in range(OPTIMIZER_BUFFER_COUNT)
            ]
        run.tag(self.buffers, "optimizer_state")

    def receive(self, index: int, grad: torch.Tensor) -> None:
        """A gradient share, staged in the gradient buffer on its way to the drive."""
        start, n = self.where[index], self.shares[index]
        with self.run.host():
            self.buffers[1][start : start + n].copy_(grad.to(self.run.host_device))

    def step(
        self,
        update: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None],
        publish: Callable[[int, torch.Tensor], None],
    ) -> None:
        """Each swapped sub-group read into the buffers, updated by `update(master, grads,
        exp_avg, exp_avg_sq)` on the host, its shares handed to `publish(index, master share)`
        while they are there, and its three states written back."""
        traffic = self.run.traffic
        for group, numel in self.swapped_groups:
            traffic.nvme_step_bytes += 4 * FP32 * numel  # master, moments, gradients in
            master, grads, exp_avg, exp_avg_sq = (b[:numel] for b in self.buffers)
            with self.run.host():
                update(master, grads, exp_avg, exp_avg_sq)
            traffic.host_compute_bytes += numel * FP32 * 7
            for index in group:
                start = self.where[index]
                publish(index, master[start : start + self.shares[index]])
            traffic.nvme_step_bytes += 3 * FP32 * numel  # master and moments out


class ParameterSwap:
    """The pinned buffers weight shares on NVMe are read through."""

    def __init__(self, run: RunState, largest_share: int) -> None:
        dtype = run.dtypes.weights
        # A share must fit one buffer (DeepSpeed asserts it): the export raises buffer_size to it.
        self.buffer_elements = aligned(max(PARAM_BUFFER_SIZE, largest_share), dtype.itemsize)
        with run.host(pinned=True):
            self.pool = torch.empty(
                self.buffer_elements * PARAM_BUFFER_COUNT, dtype=dtype, device=run.host_device
            )
        run.tag([self.pool], "parameters")
