"""On the CPU backends, autocast gives each op the dtype CUDA's autocast would give it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autofit.simulator import cuda_autocast


@pytest.fixture(scope="module", autouse=True)
def policy() -> None:
    cuda_autocast.install()


def run(fn, *tensors, dtype=torch.bfloat16):
    with torch.autocast("cpu", dtype=dtype):
        return fn(*tensors)


x32 = torch.randn(4, 16)
x16 = x32.to(torch.bfloat16)
w = torch.randn(16, 16)


@pytest.mark.parametrize(
    "name,fn,args,expected",
    [
        # CUDA's lower-precision list (CPU autocast casts these too)
        ("linear", lambda x, w: F.linear(x, w), (x32, w), torch.bfloat16),
        ("matmul", torch.matmul, (x32, w), torch.bfloat16),
        # ... and ones only CUDA casts down
        ("einsum", lambda x, w: torch.einsum("ij,jk->ik", x, w), (x32, w), torch.bfloat16),
        ("addmv", lambda w, x: torch.addmv(x[0], w, x[1]), (w, x32), torch.bfloat16),
        # CUDA's fp32 list, which CPU autocast leaves in bf16
        ("layer_norm", lambda x: F.layer_norm(x, (16,)), (x16,), torch.float32),
        ("group_norm", lambda x: F.group_norm(x.view(4, 4, 4), 2), (x16,), torch.float32),
        ("exp", torch.exp, (x16,), torch.float32),
        ("pow", lambda x: x.pow(2), (x16,), torch.float32),
        ("rsqrt", torch.rsqrt, (x16.abs(),), torch.float32),
        ("softplus", F.softplus, (x16,), torch.float32),
        # fp32 by output dtype: softmax, sum, cumsum
        ("softmax", lambda x: torch.softmax(x, -1), (x16,), torch.float32),
        ("sum", torch.sum, (x16,), torch.float32),
        ("cumsum", lambda x: torch.cumsum(x, 0), (x16,), torch.float32),
        # an explicit output dtype is respected
        (
            "softmax dtype",
            lambda x: torch.softmax(x, -1, dtype=torch.bfloat16),
            (x16,),
            torch.bfloat16,
        ),
        # promote: the widest input wins
        ("addcmul", lambda a, b: torch.addcmul(a, b, b), (x32, x16), torch.float32),
        # no CUDA policy: elementwise ops and cat keep PyTorch's own type promotion
        ("cat", lambda a, b: torch.cat([a, b]), (x16, x16), torch.bfloat16),
        ("relu", F.relu, (x16,), torch.bfloat16),
        ("mul", torch.mul, (x16, x16), torch.bfloat16),
    ],
)
def test_cast_policy_is_cudas(name, fn, args, expected) -> None:
    assert run(fn, *args).dtype == expected, name


def test_norm_gets_an_fp32_output_dtype() -> None:
    assert run(lambda x: torch.norm(x), x16).dtype == torch.float32


def test_fp16_autocast_too() -> None:
    assert run(lambda x, w: F.linear(x, w), x32, w, dtype=torch.float16).dtype == torch.float16
    assert (
        run(lambda x: F.layer_norm(x, (16,)), x32.half(), dtype=torch.float16).dtype
        == torch.float32
    )


def test_no_change_outside_autocast() -> None:
    assert F.layer_norm(x16, (16,)).dtype == torch.bfloat16
    assert torch.softmax(x16, -1).dtype == torch.bfloat16
