"""bitsandbytes' NF4 4-bit weight, as its memory looks, for fake tensors.

Known limitations: what bitsandbytes 0.50 does that this layout leaves out:

- Only NF4 with double quantization at block size 64, the QLoRA default: FP4, other block sizes
  and single quantization are not laid out.
- Every forward dequantizes the whole weight into a temporary. On CUDA, bitsandbytes' `gemm_4bit`
  runs a fused kernel that makes none for inputs of few rows (4 always, up to 1536 by the GPU's
  architecture and the weight's shape: `_gemm_4bit_use_custom_cuda`), dequantizing past that.
- Dequantizing makes more than the weight's temporary: the nested scales into fp32 (one float per
  64 weights; the CUDA fallback makes a second with the offset added), and in backward the weight
  in the dtype it was quantized from, then a copy in the gradient's dtype when they differ. Only
  `dequantize` (DoRA) makes the fp32 scales here; forward and backward make one temporary, in the
  compute dtype. bitsandbytes' CPU kernels make a few small temporaries more
  (tests/contracts/test_fake_matches_real.py, LOOSER).

bitsandbytes quantizes a weight by reading its values, which a fake tensor cannot answer, so the
`simulate` backend replaces each `nn.Linear` of a QLoRA base with `Nf4LinearLayout`, which holds
exactly the buffers bitsandbytes 0.50 keeps for an NF4 weight with double quantization (the
default QLoRA setting): the packed weight (two 4-bit values per byte), one uint8 scale per block
of 64 values, one fp32 scale per 256 of those, the 16-entry NF4 code and the 256-entry code of the
nested scales, and an offset. Like bitsandbytes' matmul, its forward dequantizes the weight into a
temporary in the compute dtype, multiplies and drops it, and its backward dequantizes again for
the input's gradient; nothing but the packed weight is kept for backward. For DoRA (QDoRA),
peft asks the layer for its whole weight every forward (`dequantize`): bitsandbytes dequantizes
the nested scales into a temporary fp32 absmax, then the weight into the dtype it was quantized
from.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

BLOCKSIZE = 64  # NF4 values per absmax scale
NESTED_BLOCKSIZE = 256  # absmax scales per nested fp32 scale


def _dequantized(layer: Nf4LinearLayout) -> torch.Tensor:
    return torch.empty(
        layer.out_features, layer.in_features, dtype=layer.compute_dtype, device=layer.weight.device
    )


class _Matmul4bit(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, layer: Nf4LinearLayout, bias: torch.Tensor | None
    ) -> torch.Tensor:  # type: ignore[override]
        ctx.layer = layer
        weight = _dequantized(layer)
        return nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        weight = _dequantized(ctx.layer)
        return grad @ weight, None, None


class Nf4LinearLayout(nn.Linear):
    """An `nn.Linear` whose weight is stored as bitsandbytes stores an NF4 weight."""

    def __init__(self, linear: nn.Linear, compute_dtype: torch.dtype, device: torch.device) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate a full weight
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.compute_dtype = compute_dtype
        self.quantized_from = linear.weight.dtype  # what dequantize() gives back, as bitsandbytes
        n = linear.in_features * linear.out_features
        blocks = -(-n // BLOCKSIZE)
        self.weight = nn.Parameter(
            torch.empty((n + 1) // 2, 1, dtype=torch.uint8, device=device), requires_grad=False
        )
        self.register_buffer("absmax", torch.empty(blocks, dtype=torch.uint8, device=device))
        self.register_buffer(
            "nested_absmax", torch.empty(-(-blocks // NESTED_BLOCKSIZE), device=device)
        )
        self.register_buffer("code", torch.empty(16, device=device))
        self.register_buffer("nested_code", torch.empty(256, device=device))
        self.register_buffer("offset", torch.empty((), device=device))
        self.bias = (
            None
            if linear.bias is None
            else nn.Parameter(linear.bias.detach().to(device, copy=True), requires_grad=False)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _Matmul4bit.apply(x.to(self.compute_dtype), self, self.bias)
        return out.to(x.dtype)

    # peft's dequantize_module_weight (peft/utils/integrations.py), which DoRA calls for the base
    # weight, asks a layer that has `W_q` (HQQ's name for its packed weight) to dequantize itself.
    @property
    def W_q(self) -> torch.Tensor:  # noqa: N802 (peft's name)
        return self.weight

    def dequantize(self) -> torch.Tensor:
        """The whole weight, as bitsandbytes' dequantize_4bit makes it: the nested absmax scales
        into an fp32 temporary first, then the weight in the dtype it was quantized from."""
        absmax = torch.empty(self.absmax.numel(), device=self.weight.device)
        weight = torch.empty(
            self.out_features, self.in_features, dtype=self.quantized_from, device=absmax.device
        )
        del absmax
        return weight
