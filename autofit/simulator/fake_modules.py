"""Moving a module that is already where it is asked to go, under fake tensors.

`Module.to(device, dtype)` rebuilds every parameter, and under fake tensors PyTorch swaps the new
parameter in place of the old one, which fails ("Couldn't swap") because the fake-tensor mode
holds weak references to it. Libraries call `.to()` on modules that are already on the right
device in the right dtype (peft moves each LoRA adapter to its base layer's device and dtype), so
`simulate` builds modules in their final dtype and makes such calls what they are: no-ops.
A call that would change a dtype or device still goes to PyTorch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

_original_to = torch.nn.Module.to


def _to_if_needed(module: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
    device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
    tensors = [*module.parameters(), *module.buffers()]
    same_device = device is None or all(t.device.type == torch.device(device).type for t in tensors)
    same_dtype = dtype is None or all(t.dtype == dtype for t in tensors if t.is_floating_point())
    if same_device and same_dtype:
        return module
    return _original_to(module, *args, **kwargs)


@contextmanager
def module_moves_are_noops() -> Iterator[None]:
    torch.nn.Module.to = _to_if_needed  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.nn.Module.to = _original_to  # type: ignore[method-assign]
