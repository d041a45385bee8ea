"""checkpointing: keep only each block's input in forward and recompute the block's activations
during backward, trading about one extra forward pass for activation memory."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autofit.knobs.base import Knob, Say, say

if TYPE_CHECKING:
    from autofit.run_state import RunState


class Checkpointing(Knob):
    name = "checkpointing"
    default = False
    help = "recompute each block's activations in backward instead of keeping them"
    kind = bool
    values = {
        True: "gradient checkpointing on every transformer block",
        False: "gradient checkpointing off",
    }
    # Said even when off: training code that checkpoints by default would differ from the probe.
    default_asks_nothing = False
    pass_only = True  # blocks recompute in backward; weights and update are the same

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        return False if value else None

    def apply(self, run: RunState, value: Any) -> None:
        if value:
            run.workload.enable_checkpointing(run.model, run.checkpoint)

    trainers = {
        "simpletuner": lambda v, s: say(gradient_checkpointing=v),
        "kohya": lambda v, s: say(gradient_checkpointing=v),
        "sana": lambda v, s: say(**{"train.grad_checkpointing": v}),
        "diffusers": {True: say(**{"--gradient_checkpointing": True}), False: Say()},
    }
