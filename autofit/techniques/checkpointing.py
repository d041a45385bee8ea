"""Gradient checkpointing: keep only each block's input in forward and recompute the block's
activations during backward, trading about one extra forward pass for activation memory."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autofit.knobs import Knob
from autofit.techniques.base import Technique

if TYPE_CHECKING:
    from autofit.training import TrainingRun


class Checkpointing(Technique):
    knob = Knob(
        "checkpointing",
        False,
        "recompute each block's activations in backward instead of keeping them",
        kind=bool,
        choices=(True, False),
    )

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        return False if value else None

    def after_build(self, run: TrainingRun, value: Any) -> None:
        if value:
            run.workload.enable_checkpointing(run.model, run.checkpoint)
