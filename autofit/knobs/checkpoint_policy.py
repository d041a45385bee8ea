"""checkpoint_policy: what a checkpointed block keeps for backward besides its input.

- `full`: nothing: backward recomputes the whole block from its input (torchtitan's
  `activation_checkpoint.mode = "full"`, what every trainer's gradient checkpointing does).
- `op`: torchtitan's per-op selective checkpointing (`mode = "selective"`, `selective_ac_option
  = "op"`): the block keeps the outputs of every other matmul, of attention, of a
  reduce-scatter and of max, and recomputes the rest (autofit/techniques/selective_checkpoint.py, torch's
  own selective checkpointing with that policy). More memory than `full`, less recomputation.

It applies to every block checkpointing wraps (with `checkpoint_interval=N`, to the layers it
checkpoints).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autofit.families import family
from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject
from autofit.models import ModelPreset

if TYPE_CHECKING:
    from autofit.run_state import RunState

FULL = "checkpoint_policy=full"


def _whole_blocks(who: str) -> Any:
    def words(value: Any, s: Subject) -> Say | Refuse:
        if value == "full":
            return Say()
        return Refuse(
            f"{who} checkpoints whole blocks; per-op selective checkpointing is torchtitan's", FULL
        )

    return words


class CheckpointPolicy(Knob):
    name = "checkpoint_policy"
    depends_on = ("checkpoint_interval", "checkpointing")
    default = "full"
    help = (
        "with checkpointing, what a checkpointed block keeps: full (its input only) | op "
        "(torchtitan's per-op selective checkpointing: every other matmul's and attention's "
        "outputs too)"
    )
    values = {
        "full": "a checkpointed block keeps only its input; backward recomputes the rest",
        "op": "torchtitan's per-op selective checkpointing (selective_ac_option=op): a "
        "checkpointed block also keeps the outputs of every other matmul, of attention, of "
        "reduce-scatters and of max",
    }
    reach = "pass"  # what forward saves and backward recomputes
    writes = ("checkpoint_contexts",)
    after = ("checkpointing",)

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return bool(config.get("checkpointing"))

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        # keeping less recomputes more: full only saves memory over op
        return "op" if value == "full" and "op" in searched else None

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value == "full":
            return None
        if not context.knobs.get("checkpointing"):
            return f"checkpoint_policy={value} needs checkpointing=true"
        interval = context.knobs.get("checkpoint_interval", 1)
        if interval > 1 and family(context.model.family).checkpoint_groups == "segments":
            return (
                f"checkpoint_policy={value} with checkpoint_interval={interval}: torchtitan's "
                "policy counts each block's matmuls, and a segment of blocks under one call is "
                "SimpleTuner's; use checkpoint_interval=1"
            )
        return None

    def apply(self, run: RunState, value: Any) -> None:
        if value == "op":
            # lazy: the knobs load without torch (docs/contributing.md)
            from autofit.techniques.selective_checkpoint import op_policy_contexts

            run.checkpoint_contexts = op_policy_contexts

    trainers = {
        vocabulary: _whole_blocks(who)
        for vocabulary, who in (
            ("simpletuner", "SimpleTuner"),
            ("kohya", "sd-scripts"),
            ("musubi", "musubi-tuner"),
            ("sana", "Sana's train.py"),
            ("diffusers", "the diffusers example scripts"),
            ("trl", "TRL (transformers' gradient checkpointing)"),
            ("axolotl", "axolotl (transformers' gradient checkpointing)"),
            # torchtune 0.6.1's ac_option "op" is documented but int()-ed (training/activations.py)
            ("torchtune", "torchtune 0.6.1"),
            ("litgpt", "LitGPT (checkpoint_wrapper on each block)"),
            ("llamafactory", "LLaMA-Factory (transformers' gradient checkpointing)"),
        )
    }
