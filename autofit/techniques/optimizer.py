"""Optimizer: which update rule runs, and so how many bytes of state each parameter carries.

- `adamw`: torch AdamW, fused (one kernel for all parameters, no temporaries), as CUDA and CPU
  allow; two states per parameter in the parameter's dtype.
- `sgd`: torch SGD with momentum 0.9 (foreach, as on CUDA by default); one state per parameter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autofit.knobs import Knob
from autofit.techniques.base import Technique

if TYPE_CHECKING:
    from autofit.training import TrainingRun

LEARNING_RATE = 1e-4


class Optimizer(Technique):
    knob = Knob(
        "optimizer",
        "adamw",
        "the update rule, which sets the optimizer state per parameter",
        choices=("adamw", "sgd"),
    )
    per_sample_memory = False  # optimizer state is per parameter, not per sample

    def after_build(self, run: TrainingRun, value: Any) -> None:
        import torch

        params = [p for p in run.model.parameters() if p.requires_grad]
        if value == "adamw":
            run.optimizer = torch.optim.AdamW(
                params, lr=LEARNING_RATE, weight_decay=0.01, fused=True
            )
        elif value == "sgd":
            run.optimizer = torch.optim.SGD(params, lr=LEARNING_RATE, momentum=0.9, foreach=True)
        else:  # the knob's choices are closed: reaching here is a bug, not bad input
            raise AssertionError(f"optimizer {value!r} has no builder")
