"""The contract between a knob and a training run.

To add a knob: subclass `Technique`, declare its `knob`, override the hooks it needs, and list an
instance in `autofit/techniques/__init__.py`. Every backend builds and steps the run through the
same hooks, so the knob does the same thing everywhere. Modules here import torch inside the hooks
only: the CLI imports them to validate values and must stay fast.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autofit.knobs import Knob

if TYPE_CHECKING:
    from autofit.gpus import GpuSpec
    from autofit.models import ModelPreset
    from autofit.training import TrainingRun


@dataclass(frozen=True)
class ProbeContext:
    """What a configuration is checked against before anything runs."""

    knobs: dict[str, Any]
    gpu: GpuSpec
    model: ModelPreset
    backend: str  # simulate | cpu | cuda (auto is resolved by then, or left as auto)


class Technique:
    """A memory or speed technique driven by one knob.

    Hooks are called in the order techniques are listed, each with the knob's value:
    `invalid_reason` before any probe starts; `before_build` before the model exists (choose the
    parameter dtype); `after_build` once it does (wrap it, build the optimizer);
    `forward_context` around every forward pass; `after_training` once the training steps are
    done, with the training state still resident (a validation pass).
    """

    knob: Knob
    # Whether the knob changes the memory each extra sample adds (the search shares its estimate
    # of that slope between configurations that differ only in knobs that do not).
    per_sample_memory = True

    @property
    def name(self) -> str:
        return self.knob.name

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        """If `value` only saves memory, at a speed cost, the value it saves over (one of
        `searched`, the values the search tries, where that matters); else None.

        The search needs such a value only at batches the faster one cannot fit.
        """
        return None

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        """Why this value cannot run in this context, or None. Decided without torch."""
        return None

    def before_build(self, run: TrainingRun, value: Any) -> None:
        pass

    def after_build(self, run: TrainingRun, value: Any) -> None:
        pass

    def forward_context(self, run: TrainingRun, value: Any) -> AbstractContextManager[Any] | None:
        return None

    def after_training(self, run: TrainingRun, value: Any) -> None:
        pass
