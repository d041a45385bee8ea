"""Precision: which dtype the weights are kept in and which dtype the math runs in.

- `fp32`: fp32 weights, fp32 math.
- `fp16`: fp32 master weights, autocast to fp16, dynamic loss scaling (fp16 gradients underflow).
- `bf16`: fp32 master weights, autocast to bf16; no loss scaling (bf16 has fp32's range).
- `bf16_pure`: bf16 weights, gradients and optimizer states, no autocast.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from autofit.knobs import Knob
from autofit.techniques.base import ProbeContext, Technique

if TYPE_CHECKING:
    from autofit.training import TrainingRun


class Precision(Technique):
    knob = Knob(
        "precision",
        "bf16",
        "weight and math dtypes: fp32 | fp16 (mixed) | bf16 (mixed) | bf16_pure (bf16 weights)",
        choices=("fp32", "fp16", "bf16", "bf16_pure"),
    )

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        gpu = context.gpu
        if value.startswith("bf16") and not gpu.bf16:
            return (
                f"precision={value} needs bf16, which {gpu.display} (compute capability "
                f"{gpu.compute_capability}) does not have; use fp16 or fp32"
            )
        return None

    def before_build(self, run: TrainingRun, value: Any) -> None:
        import torch

        run.param_dtype = torch.bfloat16 if value == "bf16_pure" else torch.float32
        run.frozen_dtype = {
            "fp16": torch.float16,
            "bf16": torch.bfloat16,
            "bf16_pure": torch.bfloat16,
        }.get(value, torch.float32)

    def after_build(self, run: TrainingRun, value: Any) -> None:
        import torch

        run.autocast_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(value)
        if value == "fp16":
            run.scaler = _loss_scaler(run.device.type)

    def forward_context(self, run: TrainingRun, value: Any) -> AbstractContextManager[Any] | None:
        import torch

        if run.autocast_dtype is None:
            return None
        # On the CPU backends the CPU autocast runs with CUDA's cast policy installed
        # (autofit/memory/cuda_autocast.py), so activations get the dtypes a GPU would give them.
        return torch.autocast(run.device.type, dtype=run.autocast_dtype)


def _loss_scaler(device_type: str) -> Any:
    import torch

    class LossScaler(torch.amp.GradScaler):
        """GradScaler that always applies the update.

        A probe measures the step of a long run, whose gradients are finite almost always. Stock
        GradScaler skips the update while it calibrates its scale in the first steps (fp16
        overflows at the initial scale of 2**16), which would leave the optimizer state
        unallocated and the step short; and a fake tensor cannot say whether it overflowed.
        Fused optimizers take the scale themselves and never reach this method.
        """

        def _maybe_opt_step(
            self, optimizer: Any, optimizer_state: Any, *args: Any, **kwargs: Any
        ) -> Any:
            return optimizer.step(*args, **kwargs)

    return LossScaler(device_type)
