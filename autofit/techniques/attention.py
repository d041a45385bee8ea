"""Attention: which scaled-dot-product-attention kernel runs.

- `sdpa`: PyTorch picks a fused kernel (flash or memory-efficient on a GPU; the CPU flash kernel
  on the CPU backends), which keeps the output and a log-sum-exp per query, never the matrix.
- `math`: the unfused path, which materialises the full attention matrix (and keeps it for
  backward): what a model falls back to when no fused kernel supports its inputs.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from autofit.knobs import Knob
from autofit.techniques.base import Technique

if TYPE_CHECKING:
    from autofit.training import TrainingRun


class Attention(Technique):
    knob = Knob(
        "attention",
        "sdpa",
        "attention kernel: sdpa (fused) | math (full attention matrix)",
        choices=("sdpa", "math"),
    )

    def forward_context(self, run: TrainingRun, value: Any) -> AbstractContextManager[Any] | None:
        if value != "math":
            return None
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(SDPBackend.MATH)
