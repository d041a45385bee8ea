"""The roofline counts FLOPs as PyTorch's formulas do (groups handled), and prices ops on the GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from autofit.gpus import load_gpu
from autofit.simulator.roofline import (
    _FORMULAS,
    HOST_SECONDS_PER_OP,
    KERNEL_FLOOR_S,
    MATMUL_EFFICIENCY,
    MEMORY_EFFICIENCY,
    RooflineCounter,
)

A40 = load_gpu("a40")


def test_matmul_is_compute_bound_at_the_bf16_peak() -> None:
    counter = RooflineCounter(A40)
    with FakeTensorMode():
        a = torch.empty(8192, 8192, dtype=torch.bfloat16)
        with counter:
            torch.mm(a, a)
    flops = 2 * 8192**3
    assert counter.cost.flops == flops
    assert counter.cost.kernels == 1
    expected = flops / (A40.tflops["bf16"] * 1e12 * MATMUL_EFFICIENCY)
    assert abs(counter.cost.device_seconds - expected) < 1e-12


def test_fp32_matmul_uses_the_fp32_peak() -> None:
    counter = RooflineCounter(A40)
    with FakeTensorMode():
        a = torch.empty(4096, 4096)
        with counter:
            torch.mm(a, a)
    assert (
        abs(
            counter.cost.device_seconds
            - 2 * 4096**3 / (A40.tflops["fp32"] * 1e12 * MATMUL_EFFICIENCY)
        )
        < 1e-12
    )


def test_elementwise_is_memory_bound_and_views_are_free() -> None:
    counter = RooflineCounter(A40)
    with FakeTensorMode():
        x = torch.empty(1 << 26)  # 256 MiB
        with counter:
            y = x.view(-1, 1024).t()  # views: no kernel
            torch.add(y, 1)
    assert counter.cost.kernels == 1
    assert counter.cost.flops == 0
    moved = 2 * (1 << 26) * 4  # read x, write the sum
    assert (
        abs(
            counter.cost.device_seconds
            - moved / (A40.memory_bandwidth_gbs * 1e9 * MEMORY_EFFICIENCY)
        )
        < 1e-12
    )


def test_tiny_kernels_cost_at_least_the_floor_and_host_time_can_dominate() -> None:
    counter = RooflineCounter(A40)
    with FakeTensorMode():
        x = torch.empty(16)
        with counter:
            for _ in range(100):
                x = x + 1
    assert abs(counter.cost.device_seconds - 100 * KERNEL_FLOOR_S) < 1e-12
    assert counter.cost.step_seconds == max(100 * KERNEL_FLOOR_S, 100 * HOST_SECONDS_PER_OP)


def test_depthwise_convolution_backward_counts_groups() -> None:
    counter = RooflineCounter(A40)
    with FakeTensorMode():
        x = torch.empty(1, 512, 32, 32, requires_grad=True)
        w = torch.empty(512, 1, 3, 3, requires_grad=True)
        with counter:
            F.conv2d(x, w, padding=1, groups=512).sum().backward()
    forward = 2 * 512 * 32 * 32 * 9  # one 3x3 filter per channel
    # forward + input gradient + weight gradient, each the forward's cost
    assert counter.cost.flops == 3 * forward


def test_block_exchanges_hidden_behind_compute_cost_nothing() -> None:
    from autofit.run_state import Exchange
    from autofit.simulator.roofline import exchange_wait

    # 1 GB/s: 1e9 bytes take a second. Each exchange may start 2 s before it is needed.
    hidden = [Exchange(ready_at=t, needed_at=t + 2.0, link_bytes=10**9) for t in (0.0, 2.0, 4.0)]
    assert exchange_wait(hidden, link_gbs=1.0) == 0.0


def test_block_exchanges_slower_than_compute_make_the_gpu_wait() -> None:
    from autofit.run_state import Exchange
    from autofit.simulator.roofline import exchange_wait

    # Three 3-second exchanges, one at a time, each ready 1 s before it is needed, needed 1 s
    # apart: the first arrives 2 s late, and each later one 2 s later again (the link is busy).
    slow = [Exchange(ready_at=t, needed_at=t + 1.0, link_bytes=3 * 10**9) for t in (0.0, 1.0, 2.0)]
    assert exchange_wait(slow, link_gbs=1.0) == pytest.approx(2.0 + 2.0 + 2.0)
    # A stall delays what follows: an exchange ready after it starts later too.
    assert exchange_wait(slow[:1], link_gbs=1.0) == pytest.approx(2.0)


@pytest.mark.parametrize("kv_heads", [8, 2], ids=["multi-head", "grouped-query"])
def test_attention_is_counted_per_query_head_without_torchs_formulas(
    kv_heads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Grouped-query attention costs what its query heads compute. Before 2.13, torch's own
    formulas refused such shapes (every Llama 3 probe crashed on an H100 with torch 2.11): the
    counter must not consult them, so here they raise."""
    from torch.utils import flop_counter

    def refused(*args: object, **kwargs: object) -> int:
        raise AssertionError("sdpa_flop_count: query/key/value shapes are incompatible")

    for packet in list(flop_counter.flop_registry):
        if "scaled_dot_product" in str(packet):
            monkeypatch.setitem(flop_counter.flop_registry, packet, refused)
    batch, heads, tokens, dim = 2, 8, 256, 64
    q = torch.randn(batch, heads, tokens, dim, requires_grad=True)
    k = torch.randn(batch, kv_heads, tokens, dim, requires_grad=True)
    v = torch.randn(batch, kv_heads, tokens, dim, requires_grad=True)
    counter = RooflineCounter(A40)
    with counter:
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True).sum().backward()
    scores = 2 * batch * heads * tokens * tokens * dim  # one product of q k^T's size
    # forward: scores and output; backward: scores again, then dV, dScores, dQ and dK
    assert counter.cost.flops == 2 * scores + 5 * scores
    # the GPU's flash kernel, on fake tensors as the simulator runs it, is counted the same way
    counter = RooflineCounter(A40)
    with FakeTensorMode():
        on_gpu = [torch.empty(t.shape, dtype=torch.bfloat16, device="cuda") for t in (q, k, v)]
        with counter:
            torch.ops.aten._scaled_dot_product_flash_attention(*on_gpu)
    assert counter.cost.flops == 2 * scores
    # every attention kernel torch has a formula for is counted by autofit's
    assert {p for p in flop_counter.flop_registry if "scaled_dot_product" in str(p)} <= set(
        _FORMULAS
    )
    # torch's own formulas (grouped-query aware from 2.13) agree
    if kv_heads == heads or torch.__version__ >= "2.13":
        shapes = (q.shape, k.shape, v.shape)
        assert flop_counter.sdpa_flop_count(*shapes) == 2 * scores
        assert flop_counter.sdpa_backward_flop_count(q.shape, *shapes) == 5 * scores
