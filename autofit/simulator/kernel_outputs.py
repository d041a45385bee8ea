"""Make fake tensors allocate what the real kernels allocate, where PyTorch's meta functions differ.

A fake op's output comes from the op's meta function, which gets shapes and dtypes right but not
always the storage a real kernel allocates or the strides it returns. The differences below were
found by comparing every allocation of a real CPU step with the same step on fake tensors
(tests/test_fake_matches_real.py keeps them equal); the kernels involved are device-generic
ATen code (aten/src/ATen/native/Loss.cpp), so a GPU allocates as the CPU does:

- `mse_loss` and `smooth_l1_loss` with a reduction compute the unreduced loss into their output
  and then resize it to a scalar, so the scalar keeps the whole unreduced buffer alive;
- their backward functions (and `huber_loss_backward`) return a contiguous gradient, while the
  meta functions copy the input's strides. A non-contiguous gradient for a non-contiguous input
  changes what autograd allocates next (a strided copy to match the layout it must accumulate).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


def _reduced_keeps_buffer(out: torch.Tensor, args: Any, kwargs: Any) -> torch.Tensor:
    reduction = args[2] if len(args) > 2 else kwargs.get("reduction", 1)
    if reduction == 0:  # Reduction::None returns the unreduced loss itself
        return out
    shape = torch.broadcast_shapes(args[0].shape, args[1].shape)
    buffer = torch.empty(shape, dtype=out.dtype, device=out.device)
    return buffer.resize_(())


def _contiguous_like_input(out: torch.Tensor, args: Any, kwargs: Any) -> torch.Tensor:
    return torch.empty(out.shape, dtype=out.dtype, device=out.device)


_FIXES = {
    aten.mse_loss.default: _reduced_keeps_buffer,
    aten.smooth_l1_loss.default: _reduced_keeps_buffer,
    aten.mse_loss_backward.default: _contiguous_like_input,
    aten.smooth_l1_loss_backward.default: _contiguous_like_input,
    aten.huber_loss_backward.default: _contiguous_like_input,
}


class RealKernelOutputs(TorchDispatchMode):
    """Between a FakeTensorMode and the tracker: replaces the outputs of the ops above with
    tensors laid out as the real kernels lay them out."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        fix = _FIXES.get(func)
        return fix(out, args, kwargs) if fix is not None else out
