"""A roofline estimate of a training step's time on a GPU, from the ops the step dispatches.

Every ATen op that would launch a kernel costs the longer of its math time (FLOPs against the
GPU's dense peak for the op's dtype, at an achievable fraction) and its memory time (bytes read
and written against the GPU's bandwidth, at an achievable fraction), and at least a minimum kernel
time. Eager PyTorch also spends host time dispatching every op; the GPU runs ahead of the host
asynchronously, so the step takes the longer of the two totals. Copies over the host link
(offload) run on their own stream, overlapped with compute: the step takes at least as long as
they do. Block swap's exchanges are scheduled one by one (`exchange_wait`): each may start when
the block it evicts is done, and the GPU waits when the block it brings is needed first. Work the
host CPU does itself (an offloaded optimizer step) waits for the GPU and the GPU waits for it, so
its time adds on. Collectives between the run's GPUs (ZeRO across GPUs) are overlapped with
compute, as DeepSpeed's `overlap_comm` does. NVMe reads and writes (ZeRO-Infinity) run at the
drive's bandwidth (the GPU entry's `nvme_gbs`): weight fetches and gradient writes overlap with compute, as
DeepSpeed prefetches them; the optimizer's swaps run between its own updates, so they add on.

FLOPs come from PyTorch's own formulas (torch.utils.flop_counter) for matmuls, convolutions and
attention; element-wise ops count no FLOPs and are bound by memory anyway. The kernel efficiencies below
are first estimates from published kernel benchmarks; the host's time per op is measured (see
HOST_SECONDS_PER_OP). Results carry `throughput_estimated: true`.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import conv_flop_count, flop_registry

from autofit.gpus import GpuSpec
from autofit.simulator.kernel_outputs import fake_device

if TYPE_CHECKING:
    from autofit.run_state import Exchange

# Fractions of peak that large kernels reach in practice (first estimates).
MATMUL_EFFICIENCY = 0.70  # cuBLAS GEMMs of training size
ATTENTION_EFFICIENCY = 0.50  # FlashAttention-2 / memory-efficient kernels, forward and backward
MEMORY_EFFICIENCY = 0.80  # element-wise and reduction kernels against peak bandwidth
KERNEL_FLOOR_S = 3e-6  # the shortest a launched kernel takes
# Host time per ATen op of an eager training step, views included: not the dispatcher alone (a few
# microseconds) but the Python around each op too (module calls and hooks, the model's own code,
# autograd recording, autocast's casts). Measured on an H100 (calibration/h100_80-core.csv): Sana
# 1600M steps of 7,394 to 12,055 ops took 158 to 271 ms whatever the batch (1 or 4), host-bound
# at 21 to 24 us per op; SimpleTuner's published SD3.5 Medium steps on an H100 imply about 25.
HOST_SECONDS_PER_OP = 21e-6
# Updates run by the host CPU (an offloaded optimizer) are bound by host memory bandwidth; a
# multi-threaded CPU Adam sustains a fraction of a server's DRAM bandwidth.
HOST_MEMORY_GBS = 40.0

aten = torch.ops.aten
_NO_KERNEL = {
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.empty_like.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    aten._unsafe_view.default,
    aten.lift_fresh.default,
    aten.set_.source_Storage_storage_offset,
}
_CONVOLUTIONS = {
    aten.convolution,
    aten._convolution,
    aten.convolution_backward,
}


def _attention_forward(
    q: Any, k: Any, v: Any, *args: Any, out_val: Any = None, **kwargs: Any
) -> int:
    """Scores (q k^T) and output (scores v), per query head: a grouped-query kernel broadcasts
    each key/value head to its group of query heads (as torch >= 2.13's formula counts, where
    older ones refuse the shapes)."""
    batch, heads, s_q, d_qk = q.shape
    s_k, d_v = k.shape[-2], v.shape[-1]
    return 2 * batch * heads * s_q * s_k * (d_qk + d_v)


def _attention_backward(
    grad: Any, q: Any, k: Any, v: Any, *args: Any, out_val: Any = None, **kwargs: Any
) -> int:
    """The scores recomputed, then the gradients of v, the scores, q and k: five products."""
    batch, heads, s_q, d_qk = q.shape
    s_k, d_v = k.shape[-2], v.shape[-1]
    return 2 * batch * heads * s_q * s_k * (3 * d_qk + 2 * d_v)


def _convolution_backward(
    grad_out: Any,
    x: Any,
    weight: Any,
    bias_sizes: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
    output_mask: Any,
    out_val: Any = None,
) -> int:
    # Each of the input and weight gradients costs what the forward convolution costs. PyTorch's
    # own formula ignores `groups` for the weight gradient and counts a depthwise convolution's
    # weight gradient thousands of times over.
    forward = conv_flop_count(x.shape, weight.shape, grad_out.shape, transposed)
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


# Every attention kernel, forward and backward: the CPU's flash kernels stand in for the GPU's.
_ATTENTION_FORWARD = (
    aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_efficient_attention,
    aten._scaled_dot_product_cudnn_attention,
)
_ATTENTION_BACKWARD = (
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten._scaled_dot_product_flash_attention_backward,
    aten._scaled_dot_product_efficient_attention_backward,
    aten._scaled_dot_product_cudnn_attention_backward,
)
_ATTENTION = {*_ATTENTION_FORWARD, *_ATTENTION_BACKWARD}
# These take precedence over PyTorch's registry: attention is counted here for every kernel (the
# registry knows only the GPU ones, and before torch 2.13 refuses grouped-query shapes, which
# crashed every probe of a Llama 3 or Qwen 2.5 on torch 2.11, calibration/h100_80-published.csv),
# and convolution_backward is fixed.
_FORMULAS = {
    **dict.fromkeys(_ATTENTION_FORWARD, _attention_forward),
    **dict.fromkeys(_ATTENTION_BACKWARD, _attention_backward),
    aten.convolution_backward: _convolution_backward,
}


def _io_bytes(value: Any) -> int:
    """Bytes a kernel touches for this argument: the tensor's elements, or its whole storage when
    smaller (a broadcast view reads its storage, not every logical element)."""
    if isinstance(value, torch.Tensor):
        logical = value.numel() * value.element_size()
        return min(logical, value.untyped_storage().nbytes())
    if isinstance(value, (list, tuple)):
        return sum(_io_bytes(v) for v in value)
    return 0


def _first_dtype(args: Any) -> torch.dtype | None:
    for value in args:
        if isinstance(value, torch.Tensor):
            return value.dtype
    return None


@dataclass
class StepCost:
    """What the roofline counted over one training step."""

    flops: int = 0
    bytes: int = 0
    ops: int = 0
    kernels: int = 0
    device_seconds: float = 0.0
    link_seconds: float = 0.0  # host-to-device and back
    peer_seconds: float = 0.0  # collectives between the run's GPUs
    host_compute_seconds: float = 0.0  # updates the host CPU runs
    nvme_seconds: float = 0.0  # NVMe reads and writes overlapped with compute
    nvme_step_seconds: float = 0.0  # the optimizer step's NVMe swaps, between its updates
    exchange_wait_seconds: float = 0.0  # the GPU waiting for block swap's exchanges

    @property
    def host_seconds(self) -> float:
        return self.ops * HOST_SECONDS_PER_OP

    @property
    def step_seconds(self) -> float:
        overlapped = max(
            self.device_seconds + self.exchange_wait_seconds,
            self.host_seconds,
            self.link_seconds,
            self.peer_seconds,
            self.nvme_seconds,
        )
        return overlapped + self.host_compute_seconds + self.nvme_step_seconds


def exchange_wait(exchanges: Sequence[Exchange], link_gbs: float) -> float:
    """How long the GPU waits for block swap's exchanges over one step.

    The exchanges run on the host link one after another (sd-scripts' single swap thread), each
    from the moment the block it evicts is done; the GPU stalls when a block is needed before its
    exchange ends, and every later moment moves by the stall. Times are the roofline's device
    times, which count no stall."""

    stalled_at: list[float] = []  # device times (unstalled) from which each delay holds
    delays: list[float] = []  # total delay from that time on
    link_free = 0.0

    def delay_at(time: float) -> float:
        index = bisect.bisect_right(stalled_at, time)
        return delays[index - 1] if index else 0.0

    for exchange in exchanges:
        start = max(exchange.ready_at + delay_at(exchange.ready_at), link_free)
        link_free = start + exchange.link_bytes / (link_gbs * 1e9)
        needed = exchange.needed_at + delay_at(exchange.needed_at)
        if link_free > needed:
            total = delay_at(exchange.needed_at) + link_free - needed
            stalled_at.append(exchange.needed_at)
            delays.append(total)
    return delays[-1] if delays else 0.0


@dataclass(frozen=True)
class Kernel:
    """One launched kernel as the roofline priced it: bytes moved, FLOPs, and the math rate
    (FLOP/s) its FLOPs run at (0.0 without FLOPs)."""

    nbytes: int
    flops: int
    rate: float
    at: int = 0  # where it ran: how many allocation events the step's log held then


@dataclass(frozen=True)
class Traffic:
    """What `RooflineCounter.add_traffic` was given for a step."""

    link_bytes: int
    host_compute_bytes: int
    peer_bytes: int
    exchanges: tuple[Exchange, ...]
    nvme_bytes: int
    nvme_step_bytes: int


def memory_bandwidth(gpu: GpuSpec) -> float:
    """The bytes per second element-wise kernels reach on `gpu`."""
    return gpu.memory_bandwidth_gbs * 1e9 * MEMORY_EFFICIENCY


def _kernel_seconds(nbytes: int, flops: int, rate: float, bandwidth: float) -> float:
    """A kernel's device time: the longer of its memory time and its math time, at least the
    floor."""
    seconds = nbytes / bandwidth
    if flops:
        seconds = max(seconds, flops / rate)
    return max(seconds, KERNEL_FLOOR_S)


def device_clock(
    nbytes: np.ndarray, flops: np.ndarray, rates: np.ndarray, bandwidth: float
) -> np.ndarray:
    """The roofline's device clock before each kernel and after the last, for kernels of these
    bytes, FLOPs and math rates: `_kernel_seconds` of each, summed one after another as a
    RooflineCounter sums them (a running sum in order, so the same floats; integers below 2**53
    divide as Python divides them)."""
    seconds = nbytes.astype(np.float64) / bandwidth
    math = flops != 0
    seconds[math] = np.maximum(seconds[math], flops[math].astype(np.float64) / rates[math])
    seconds = np.maximum(seconds, KERNEL_FLOOR_S)
    return np.concatenate(([0.0], np.cumsum(seconds)))


def kernel_arrays(kernels: Sequence[Kernel]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernels' bytes, FLOPs and math rates, as arrays (what `device_clock` takes)."""
    count = len(kernels)
    return (
        np.fromiter((k.nbytes for k in kernels), np.int64, count),
        np.fromiter((k.flops for k in kernels), np.int64, count),
        np.fromiter((k.rate for k in kernels), np.float64, count),
    )


def price(gpu: GpuSpec, kernels: Sequence[Kernel], ops: int, traffic: Traffic) -> StepCost:
    """The cost a RooflineCounter on `gpu` would have counted for a step of these kernels,
    `ops` dispatched ops and this traffic: the same sums in the same order, so the same floats."""
    return price_arrays(gpu, *kernel_arrays(kernels), ops, traffic)


def price_arrays(
    gpu: GpuSpec,
    nbytes: np.ndarray,
    flops: np.ndarray,
    rates: np.ndarray,
    ops: int,
    traffic: Traffic,
    clock: np.ndarray | None = None,
) -> StepCost:
    """`price` of kernels given as arrays of their bytes, FLOPs and rates (`clock`: their
    `device_clock` on `gpu`, where the caller has it)."""
    counter = RooflineCounter(gpu)
    cost = counter.cost
    if clock is None:
        clock = device_clock(nbytes, flops, rates, memory_bandwidth(gpu))
    cost.ops, cost.kernels = ops, len(nbytes)
    cost.flops, cost.bytes = int(flops.sum()), int(nbytes.sum())
    cost.device_seconds = float(clock[-1])
    counter.add_traffic(
        traffic.link_bytes, traffic.host_compute_bytes, traffic.peer_bytes, traffic.exchanges,
        traffic.nvme_bytes, traffic.nvme_step_bytes,
    )  # fmt: skip
    return cost


class RooflineCounter(TorchDispatchMode):
    """Accumulates a `StepCost` for the ops dispatched under it, priced on `gpu`."""

    def __init__(self, gpu: GpuSpec, keep_kernels: bool = False) -> None:
        """`keep_kernels`: also keep each kernel's figures (`kernels`) and what `add_traffic`
        was given (`traffic`), so that `price` can price the step again with other figures."""
        super().__init__()
        self.supports_higher_order_operators = True  # as MemoryTracker; priced as no kernel
        self.gpu = gpu
        self._bandwidth = memory_bandwidth(gpu)
        self._keep_kernels = keep_kernels
        self.reset()

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """The compiled graph's ops are priced, not the compiler's (as MemoryTracker)."""
        return True

    def reset(self) -> None:
        """Forget what was counted: the counter is as new."""
        self.cost = StepCost()
        self.kernels: list[Kernel] | None = [] if self._keep_kernels else None
        self.traffic: Traffic | None = None
        self.where: Callable[[], int] = lambda: 0  # a kept kernel's `at`

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        device = fake_device(func, args)
        if device is not None:
            return device
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace != "aten":  # prim.layout and friends: metadata queries, not kernels
            return out
        self.cost.ops += 1
        if func.is_view or func in _NO_KERNEL:
            return out
        packet = func.overloadpacket
        formula = _FORMULAS.get(packet) or flop_registry.get(packet)
        flops = int(formula(*args, **kwargs, out_val=out)) if formula else 0
        nbytes = _io_bytes(args) + _io_bytes(list(kwargs.values())) + _io_bytes(out)
        rate = self._math_rate(packet, _first_dtype(args)) if flops else 0.0
        if self.kernels is not None:
            self.kernels.append(Kernel(nbytes, flops, rate, self.where()))
        self.cost.flops += flops
        self.cost.bytes += nbytes
        self.cost.kernels += 1
        self.cost.device_seconds += _kernel_seconds(nbytes, flops, rate, self._bandwidth)
        return out

    def add_traffic(
        self,
        link_bytes: int,
        host_compute_bytes: int,
        peer_bytes: int,
        exchanges: Sequence[Exchange] = (),
        nvme_bytes: int = 0,
        nvme_step_bytes: int = 0,
    ) -> None:
        """Price what the step moved over the host link, to the other GPUs and to NVMe, what the
        host CPU computed, and the waits for block swap's exchanges."""
        if self.kernels is not None:
            self.traffic = Traffic(
                link_bytes, host_compute_bytes, peer_bytes, tuple(exchanges), nvme_bytes,
                nvme_step_bytes,
            )  # fmt: skip
        self.cost.exchange_wait_seconds += exchange_wait(exchanges, self.gpu.host_link_gbs)
        self.cost.link_seconds += link_bytes / (self.gpu.host_link_gbs * 1e9)
        self.cost.peer_seconds += peer_bytes / (self.gpu.peer_link_gbs * 1e9)
        self.cost.host_compute_seconds += host_compute_bytes / (HOST_MEMORY_GBS * 1e9)
        self.cost.nvme_seconds += nvme_bytes / (self.gpu.nvme_gbs * 1e9)
        self.cost.nvme_step_seconds += nvme_step_bytes / (self.gpu.nvme_gbs * 1e9)

    def _math_rate(self, packet: Any, dtype: torch.dtype | None) -> float:
        tflops = self.gpu.tflops
        if dtype in (torch.bfloat16, torch.float16) and not self.gpu.tensor_cores:
            # fp32 accumulation without tensor cores: the FP32 units do the math
            peak = tflops["fp32"]
        elif dtype == torch.bfloat16:
            peak = tflops.get("bf16", tflops["fp32"])
        elif dtype == torch.float16:
            peak = tflops["fp16"]
        elif packet in _CONVOLUTIONS:  # cuDNN allows TF32 for fp32 convolutions by default
            peak = tflops.get("tf32", tflops["fp32"])
        else:  # fp32 matmuls: PyTorch leaves TF32 off for them by default
            peak = tflops["fp32"]
        efficiency = ATTENTION_EFFICIENCY if packet in _ATTENTION else MATMUL_EFFICIENCY
        return peak * 1e12 * efficiency
