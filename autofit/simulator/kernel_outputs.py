"""Make fake tensors allocate what the real kernels allocate, where PyTorch's meta functions differ.

A fake op's output comes from the op's meta function, which gets shapes and dtypes right but not
always the storage a real kernel allocates or the strides it returns. The differences below were
found by comparing every allocation of a real CPU step with the same step on fake tensors
(tests/contracts/test_fake_matches_real.py keeps them equal); the kernels involved are device-generic
ATen code (aten/src/ATen/native/Loss.cpp), so a GPU allocates as the CPU does:

- `mse_loss` and `smooth_l1_loss` with a reduction compute the unreduced loss into their output
  and then resize it to a scalar, so the scalar keeps the whole unreduced buffer alive;
- their backward functions (and `huber_loss_backward`) return a contiguous gradient, while the
  meta functions copy the input's strides. A non-contiguous gradient for a non-contiguous input
  changes what autograd allocates next (a strided copy to match the layout it must accumulate).

`RealLayoutFakeMode` is a FakeTensorMode that makes these fixes itself, rather than a second
dispatch mode above the fake one: every op of a traced step crosses one Python dispatch-mode layer
fewer (about 5 us per op and layer). It also writes the key of FakeTensorMode's dispatch cache
faster (`_prep_args_for_hash`), with the same facts of each tensor, and makes an output from the
cache with fewer steps (`_get_output_tensor_from_cache_entry`).

One more thing a real step has that fake tensors lack: a random draw a model decides on. PEFT's
LoHa and LoKr layers apply their module dropout with `torch.rand(1) > module_dropout` every
forward, a branch on a tensor's value. A draw of at most one number on the CPU is made for real,
from the CPU's generator as the real step draws it, and held as a constant fake tensor, whose
value FakeTensorMode carries through the ops on it (a comparison, `bool()`): the branch goes the
way the real step's would, and the fake step allocates what the real one does (4 bytes).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import CONSTANT_NUMEL_LIMIT, FakeTensor, FakeTensorMode

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


# The draws a model may branch on (torch.rand's overloads that make a new tensor).
_DRAWS = frozenset({aten.rand.default, aten.rand.generator})


def _drawn_for_real(args: Any, kwargs: Any) -> bool:
    """Whether a draw is one RealLayoutFakeMode makes for real: at most a constant's numel (one),
    on the CPU, whose generator the real step draws from too."""
    numel = 1
    for size in args[0]:
        if not isinstance(size, int):
            return False
        numel *= size
    device = kwargs.get("device")
    return numel <= CONSTANT_NUMEL_LIMIT and (device is None or torch.device(device).type == "cpu")


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
        # A higher-order op (a compiled graph's run_and_save_rng_state) finds its fake rule by
        # the mode's exact type, which a subclass is not: FakeTensorMode's own dispatch runs
        # the rules it registers (torch/_higher_order_ops/utils.py, register_fake).
        self.supports_higher_order_operators = True

    def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        # FakeTensorMode.__torch_dispatch__ calls this for every op; overriding it, not
        # __torch_dispatch__, adds no second dynamo-disabling wrapper per op.
        if func in _DRAWS and _drawn_for_real(args, kwargs or {}):
            # Inside the mode's dispatch no mode is set: the op runs the CPU's kernel.
            drawn = func(*args, **(kwargs or {}))
            return self.fake_tensor_converter.from_real_tensor(self, drawn, make_constant=True)
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

    def _prep_args_for_hash(
        self, result: list[object], args: Any, state: Any, id_hashed_objects: list[object]
    ) -> None:
        """The args' part of the dispatch cache's key, as FakeTensorMode writes it but for a
        plain fake tensor (strided, of this mode, sizes not symbolic): its facts as one tuple.

        A traced op is answered from the cache almost always, and its key, written field by
        field through TensorMetadata for every tensor, was a third of a trace: a scan traces
        Sana 1600M's steps in 1.54 s with that key, 0.99 s with this one, side by side on two
        cores (benchmarks/trace_speed.py). The tuple holds every field of TensorMetadata that
        can differ for such a tensor, except its memory format, which its sizes and strides
        decide. Its first item, `_TENSOR`, appears in no key FakeTensorMode writes, so no key
        of another mode's can equal one of these. Anything else is written by FakeTensorMode's
        own code, which also says when an op cannot be cached (an unsupported argument raises
        there). tests/test_fake_cache.py holds the two keys to telling apart the same."""
        if isinstance(args, dict):  # FakeTensorMode's: it writes keys, then values, through here
            return super()._prep_args_for_hash(result, args, state, id_hashed_objects)
        if isinstance(args, (list, tuple)):
            result.append(type(args))
            result.append(f"length_{len(args)}")
        for arg in args:
            kind = type(arg)
            if kind in _PLAIN:  # as FakeTensorMode writes a value that is not a tensor
                result.append(kind)
                result.append(arg)
            elif kind is FakeTensor and self._plain(arg):
                result.append((
                    _TENSOR, arg.dtype, tuple(arg.shape), arg.stride(), arg.fake_device,
                    arg.storage_offset(), arg.untyped_storage().nbytes(), arg.requires_grad,
                    arg.is_quantized, arg.is_conj(), arg.is_neg(), arg.is_inference(),
                ))  # fmt: skip
            elif kind is list or kind is tuple:
                self._prep_args_for_hash(result, arg, state, id_hashed_objects)
            else:
                super()._prep_args_for_hash(result, (arg,), state, id_hashed_objects)

    def _get_output_tensor_from_cache_entry(
        self, state: Any, entry: Any, key: Any, func: Any, args: Any
    ) -> Any:
        """An op's output made from its cache entry, as FakeTensorMode makes it, without its
        steps for symbolic sizes where there are none (no shape environment): an empty meta
        tensor with the entry's layout, on the input's storage for a view, made fake: a
        Sana 1600M trace 0.93 s to 0.82 s (with the key, 1.49 s to 0.82 s,
        benchmarks/trace_speed.py). Anything else is FakeTensorMode's, and
        tests/test_fake_cache.py holds both to making the same outputs."""
        metadata = entry.metadata
        if self.shape_env is not None or entry.inplace_idx is not None or metadata is None:
            return super()._get_output_tensor_from_cache_entry(state, entry, key, func, args)
        view = isinstance(func, torch._ops.OpOverload) and func.is_view
        storage = args[entry.view_idx].untyped_storage() if view else None
        previous = self.in_kernel_invocation
        # What in_kernel_invocation_manager sets, once for the whole output, without a generator
        # (that context manager's own cost was a twentieth of a trace).
        with torch._C._DisableTorchDispatch(), torch._C._PreserveDispatchKeyGuard():
            self.in_kernel_invocation = True
            torch._C._set_meta_in_tls_dispatch_include(True)
            try:
                empty = torch.empty_strided(
                    metadata.shape, metadata.stride, dtype=metadata.dtype,
                    layout=metadata.layout, device="meta", requires_grad=metadata.requires_grad,
                )  # fmt: skip
                if metadata.is_conj:
                    torch._C._set_conj(empty, True)
                if metadata.is_neg:
                    torch._C._set_neg(empty, True)
                if storage is not None:
                    empty.set_(storage, metadata.storage_offset, metadata.shape, metadata.stride)
            finally:
                self.in_kernel_invocation = previous
        return FakeTensor(self, empty, metadata.device)

    def _plain(self, tensor: FakeTensor) -> bool:
        """Whether FakeTensorMode would key `tensor` by its metadata alone (not a constant, not
        sparse, not of another mode, no symbolic sizes)."""
        return (
            tensor.fake_mode is self
            and tensor.constant is None
            and tensor.layout is torch.strided
            and not tensor._has_symbolic_sizes_strides
        )


# Marks a fake tensor's facts in a dispatch cache key (RealLayoutFakeMode._prep_args_for_hash).
_TENSOR = object()
# Values FakeTensorMode keys by type and value (its last case); any other is left to it.
_PLAIN = frozenset(
    {int, float, bool, type(None), str, torch.dtype, torch.device, torch.layout,
     torch.memory_format}
)  # fmt: skip
