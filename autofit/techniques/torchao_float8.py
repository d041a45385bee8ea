"""torchao's float8 dynamic-activation base as SimpleTuner trains on it (its fp8-torchao).

torchao's `Float8DynamicActivationFloat8WeightConfig` stores each weight in float8 e4m3 with one
fp32 scale per tensor, and its linear quantizes the input to float8 on every call (torchao's own
`_choose_quant_func_and_quantize_tensor`: an absolute maximum, a scale, the input divided by it
in fp32, clamped, cast to e4m3) before `torch._scaled_mm`. torchao runs that only for inference:
`_scaled_mm` has no derivative. SimpleTuner makes it train (helpers/training/quantisation/
torchao_workarounds.py, its `_ScaledMmInputGrad` in place of torchao's
`addmm_float8_unwrapped_inference` whenever an input needs a gradient): the matmul keeps the
input's scale and the weight's float8 data and scale for backward, not the float8 input, and its
backward dequantizes the weight to the gradient's dtype and multiplies by both scales. autofit
puts `ScaledMatmulInputGrad` there, which keeps and computes the same; everything before it is
torchao's code, whose quantization autograd records (the input requires a gradient), so the
copies it saves for backward (the input and its absolute value, the divided and clamped fp32
copies) are what a step holds per quantized layer.

torchao refuses the config unless the local GPU has float8 matmuls (compute capability 8.9 or
more); autofit checks the target's instead (base_precision's rules) and runs torchao's
`_scaled_mm` call where it runs: for real on a CUDA GPU and on the CPU, and on fake tensors.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

# The module whose global torchao's float8 linear calls for its float8 matmul.
_FLOAT8_TENSOR = "torchao.quantization.quantize_.workflows.float8.float8_tensor"


class ScaledMatmulInputGrad(torch.autograd.Function):
    """torchao's float8 matmul with the gradient for its input, keeping what SimpleTuner's
    `_ScaledMmInputGrad` keeps."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        a_data: torch.Tensor,
        a_scale: torch.Tensor,
        b_data: torch.Tensor,
        b_scale: torch.Tensor,
        bias: torch.Tensor | None,
        output_dtype: torch.dtype,
        use_fast_accum: bool,
    ) -> torch.Tensor:
        ctx.save_for_backward(a_scale, b_data, b_scale)
        ctx.input_shape = a_data.shape
        return torch._scaled_mm(
            a_data, b_data, scale_a=a_scale, scale_b=b_scale, bias=bias,
            out_dtype=output_dtype, use_fast_accum=use_fast_accum,
        )  # fmt: skip

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        from torchao.quantization.quant_primitives import _dequantize_affine_float8

        a_scale, b_data, b_scale = ctx.saved_tensors
        rows = grad_output.reshape(-1, grad_output.shape[-1])
        weight = _dequantize_affine_float8(b_data, b_scale, grad_output.dtype)
        grad = rows.matmul(weight.t()).reshape(ctx.input_shape)
        return grad * a_scale.to(grad.dtype), None, None, None, None, None, None


def _trainable_addmm(original: Any) -> Any:
    def addmm_float8(
        a_data: torch.Tensor,
        a_scale: torch.Tensor,
        b_data: torch.Tensor,
        b_scale: torch.Tensor,
        output_dtype: torch.dtype,
        output_scale: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        use_fast_accum: bool = False,
    ) -> torch.Tensor:
        if output_scale is None and a_data.requires_grad:
            return ScaledMatmulInputGrad.apply(
                a_data, a_scale, b_data, b_scale, bias, output_dtype, use_fast_accum
            )
        return original(
            a_data, a_scale, b_data, b_scale, output_dtype, output_scale, bias, use_fast_accum
        )

    addmm_float8.autofit_trainable = True  # type: ignore[attr-defined]
    return addmm_float8


def make_float8_matmuls_trainable() -> None:
    """Route torchao's float8 linear through `ScaledMatmulInputGrad` where its input needs a
    gradient (once per process; inference calls keep torchao's own path)."""
    module = importlib.import_module(_FLOAT8_TENSOR)
    current = module.addmm_float8_unwrapped_inference
    if not getattr(current, "autofit_trainable", False):
        module.addmm_float8_unwrapped_inference = _trainable_addmm(current)


@contextmanager
def target_has_float8_matmuls() -> Iterator[None]:
    """torchao's hardware check answered for the target GPU (checked by the knob's rules), not
    the machine the probe runs on."""
    quant_api = importlib.import_module("torchao.quantization.quant_api")
    check = quant_api._check_hardware_support
    quant_api._check_hardware_support = lambda granularities: None
    try:
        yield
    finally:
        quant_api._check_hardware_support = check
