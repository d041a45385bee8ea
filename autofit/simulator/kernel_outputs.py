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

`RealLayoutFakeMode` is a FakeTensorMode that makes these fixes itself, rather than a second
dispatch mode above the fake one: every op of a traced step crosses one Python dispatch-mode layer
fewer (about 5 us per op and layer).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

aten = torch.ops.aten
_DEVICE_QUERY = torch.ops.prim.device.default


def fake_device(func: Any, args: Any) -> torch.device | None:
    """The answer to `func` where it asks a fake tensor's device, as the fake tensor answers it
    itself (FakeTensor.__torch_dispatch__); None for any other op.

    The autograd engine and model code ask every tensor's device, and a fake tensor's device is
    answered in Python, through every dispatch mode above the fake one: 26,091 of the 36,266 ops
    of a Sana 1600M probe's two steps. Those modes pass the question down unchanged (it allocates
    nothing and runs no kernel), so the outermost of them answers it here: a whole Sana probe
    went from 4.47 s to 4.09 s on two cores (benchmarks/probe_speed.py --against)."""
    if func is not _DEVICE_QUERY or not isinstance(args[0], FakeTensor):
        return None
    tensor = args[0]
    return torch.device("meta") if tensor.fake_mode.in_kernel_invocation else tensor.fake_device


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


class RealLayoutFakeMode(FakeTensorMode):
    """A FakeTensorMode whose outputs of the ops above are laid out as the real kernels lay them
    out.

    The fixes apply to the ops dispatched to the mode from outside only (what a mode above the
    fake one would see): not to the ops a decomposition running inside the fake mode dispatches
    back to it. The fix's own ops run fake, under this mode."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._depth = 0  # dispatches in progress: 0 outside, 1 in an op from outside

    def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # FakeTensorMode.__torch_dispatch__ calls this for every op; overriding it, not
        # __torch_dispatch__, adds no second dynamo-disabling wrapper per op.
        self._depth += 1
        try:
            out = super().dispatch(func, types, args, kwargs)
        finally:
            self._depth -= 1
        fix = _FIXES.get(func) if self._depth == 0 else None
        if fix is None:
            return out
        with self:  # outside its own dispatch the mode is not set: set it for the fix's ops
            return fix(out, args, kwargs or {})
