"""checkpoint_stride: with checkpoint_interval N, the N checkpointed blocks start every S blocks
and the S - N between them run unchecked (SimpleTuner's `gradient_checkpointing_segment_stride`:
interval 2, stride 4 checkpoints blocks 0-1, 4-5, ... and runs 2-3, 6-7, ... as they are). 0: no
stride, S = N. checkpoint_interval's plan reads it (autofit/knobs/checkpoint_interval.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autofit.families import family
from autofit.knobs.base import Knob, ProbeContext, Say, Subject, say
from autofit.models import ModelPreset


class CheckpointStride(Knob):
    name = "checkpoint_stride"
    depends_on = ("checkpoint_interval", "checkpointing")
    default = 0
    help = (
        "with checkpoint_interval N: checkpoint N blocks of every S and run the rest unchecked "
        "(SimpleTuner's gradient_checkpointing_segment_stride); 0: S = N"
    )
    kind = int
    minimum = 0
    reach = "pass"

    def means(self, value: Any, subject: Subject) -> str:
        interval = subject.config.get("checkpoint_interval", 1)
        return f"{interval} checkpointed blocks in every {value}, the rest unchecked"

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return bool(config.get("checkpointing")) and config.get("checkpoint_interval", 1) > 1

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if not value:
            return None
        interval = context.knobs.get("checkpoint_interval", 1)
        if interval <= 1:
            return f"checkpoint_stride={value} needs checkpoint_interval above 1"
        if family(context.model.family).checkpoint_groups == "layers":
            return (
                f"checkpoint_stride={value}: a language model's every-N-th-layer checkpointing "
                "(torchtitan's) has no stride; valid: 0"
            )
        if value < interval:
            return (
                f"checkpoint_stride={value} is less than checkpoint_interval={interval}; "
                f"valid: 0, or {interval} and more"
            )
        return None

    trainers = {
        "simpletuner": lambda v, s: (
            Say() if not v else say(gradient_checkpointing_segment_stride=v)
        ),
    }
