"""Optimizer: which update rule runs, and so how many bytes of state each parameter carries.

- `adamw`: torch AdamW, fused; two states like the parameter.
- `adamw8bit`, `paged_adamw8bit`, `lion8bit`: bitsandbytes' block-wise 8-bit states (one byte per
  element per state, plus an fp32 scale per 256 elements); the paged one keeps large states in
  CUDA unified memory, paged to the host under pressure.
- `adafactor`: transformers' Adafactor, factored second moments (a row and a column vector per
  matrix), no first moment.
- `came`: CAME, factored second moments and factored confidence, plus a first moment.
- `lion`: Lion, one state like the parameter.
- `adamw_bf16`: bf16 states on bf16 weights, updates rounded stochastically (SimpleTuner's).
- `sgd`: momentum 0.9, one state like the parameter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autofit.knobs import Knob
from autofit.optimizers import BUILDERS
from autofit.techniques.base import ProbeContext, Technique

if TYPE_CHECKING:
    from autofit.training import TrainingRun

CHOICES = tuple(BUILDERS)  # every optimizer autofit can build, in the knob's order


class Optimizer(Technique):
    knob = Knob(
        "optimizer",
        "adamw",
        "the update rule, which sets the optimizer state per parameter",
        choices=CHOICES,
    )
    per_sample_memory = False  # optimizer state is per parameter, not per sample

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value == "paged_adamw8bit" and context.backend == "cpu":
            return "optimizer=paged_adamw8bit pages its state through CUDA unified memory: it needs the cuda or simulate backend"
        if value == "adamw_bf16" and context.knobs.get("precision") != "bf16_pure":
            return "optimizer=adamw_bf16 trains bf16 weights: it needs precision=bf16_pure"
        return None

    def after_build(self, run: TrainingRun, value: Any) -> None:
        from autofit.optimizers import build_optimizer

        on_device = build_optimizer(value, run.device_trainable_parameters(), run)
        if not run.host_parameters:
            run.optimizer = on_device
            return
        from autofit.optimizers.split import HostSplitOptimizer

        run.optimizer = HostSplitOptimizer(
            on_device, build_optimizer(value, run.host_parameters, run), run
        )
