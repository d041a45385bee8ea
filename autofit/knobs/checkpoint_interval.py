"""checkpoint_interval: gradient checkpointing every N blocks instead of every block, as
SimpleTuner's `gradient_checkpointing_interval` does (with `checkpoint_stride`, its
`gradient_checkpointing_segment_stride`), and torchtitan's selective layer checkpointing for
language models.

How the blocks are grouped is the family's (`Family.checkpoint_groups`; SimpleTuner's semantics
for its transformers, helpers/training/gradient_checkpointing_interval.py):

- `segments` (SD3, Flux's two lists): N contiguous blocks run under one non-reentrant checkpoint
  call, so forward keeps only each segment's inputs and backward recomputes the whole segment at
  once, all N blocks' activations alive together (`checkpoint_sequential_state`). With a stride S
  a segment starts every S blocks and the S - N blocks between run unchecked, keeping all they
  save. Recomputation is the same as every block's: each checkpointed block runs twice.
- `blocks` (Sana): each block on its own, block i checkpointed when i % N == 0, or with a stride
  when i % S < N (`should_checkpoint_block`); the rest run unchecked.
- `layers` (language models): each layer on its own, layer i checkpointed when (i + 1) % N == 0,
  as torchtitan's `apply_ac` wraps every N-th layer it is handed, counting from 1
  (`activation_checkpoint.mode = "selective"`, `selective_ac_option = "N"`; torchtune's
  `ac_mode: selective`, `ac_option: N` is the same code); the rest run unchecked, no stride.
  transformers' layers checkpoint themselves, handing the checkpoint function their forward
  bound to the layer (`partial(forward, layer)`), which the plan places by that layer.

The model's own loop still calls the checkpoint function block by block; for a segment the plan
runs the segment's blocks itself at its first block, handing each the inputs the loop would
(`Workload.next_block_inputs`), and answers the segment's other blocks with its output.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from autofit.families import declaring, family
from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.models import ModelPreset

if TYPE_CHECKING:
    from autofit.run_state import RunState

EVERY_BLOCK = "checkpoint_interval=1"


def _every_layer(who: str) -> Any:
    """The words of a trainer on transformers' gradient checkpointing: every layer or none."""

    def words(value: Any, s: Subject) -> Say | Refuse:
        if value == 1:
            return Say()
        return Refuse(
            f"{who}'s gradient_checkpointing checkpoints every layer (transformers' own); "
            "every N-th layer is torchtitan's and torchtune's",
            EVERY_BLOCK,
        )

    return words


def _torchtune(value: Any, s: Subject) -> Say | Refuse:
    """torchtune 0.6.1 checkpoints every N-th layer, counted from 1, with `ac_mode: selective`,
    `ac_option: N` (training/activations.py, torchtitan's code), read by full_finetune_distributed
    alone, and there only while enable_activation_checkpointing is off (checkpointing's words)."""
    if value == 1:
        return Say()
    if s.config.get("train_mode", "full") != "full" or s.world_size == 1:
        return Refuse(
            "torchtune 0.6.1 checkpoints every N-th layer (ac_mode: selective) in its "
            "full_finetune_distributed recipe only: a full fine-tune on more than one GPU",
            EVERY_BLOCK,
        )
    return say(ac_mode="selective", ac_option=value)


class CheckpointPlan:
    """The checkpoint function a run hands its model when it checkpoints every N blocks."""

    def __init__(self, run: RunState, interval: int, stride: int, groups: str) -> None:
        self.run, self.interval, self.groups = run, interval, groups
        self.stride = stride or interval
        self.explicit_stride = bool(stride)
        self.where: dict[int, tuple[list[Any], int]] = {}
        self.carried: dict[int, Any] = {}  # a segment's later blocks -> the segment's output

    def _place(self, block: Any) -> tuple[list[Any], int]:
        if not self.where:  # the model is final by its first forward (wrapped, sharded)
            for path in self.run.preset.blocks:
                members = list(self.run.model.get_submodule(path))
                for index, member in enumerate(members):
                    self.where[id(member)] = (members, index)
        if isinstance(block, partial) and block.args:  # a layer's forward bound to the layer
            block = block.args[0]
        return self.where[id(block)]

    def checked(self, index: int) -> bool:
        """SimpleTuner's should_checkpoint_block; torchtitan's count for `layers`."""
        if self.groups == "layers":
            return (index + 1) % self.interval == 0
        if self.explicit_stride:
            return index % self.stride < self.interval
        return index % self.interval == 0

    def __call__(self, block: Any, *args: Any, **kwargs: Any) -> Any:
        members, index = self._place(block)
        if self.groups in ("blocks", "layers"):
            if self.checked(index):
                return self.run.checkpoint_call(block, *args, **kwargs)
            return block(*args, **kwargs)
        if id(block) in self.carried:
            return self.carried.pop(id(block))
        start = index - index % self.stride
        segment = members[index : start + self.interval]
        if not segment:  # between segments: runs unchecked
            return block(*args, **kwargs)
        assert not kwargs, "a segment hands its blocks their inputs by position"
        next_inputs = self.run.workload.next_block_inputs

        def run_segment(*inputs: Any) -> Any:
            output = None
            for member in segment:
                output = member(*inputs)
                inputs = next_inputs(output, inputs)
            return output

        output = self.run.checkpoint_call(run_segment, *args)
        for member in segment[1:]:
            self.carried[id(member)] = output
        return output


def _ordinal(n: int) -> str:
    """2nd, 3rd, 4th, 11th, 21st: how `means` counts blocks."""
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _sana(value: Any, s: Subject) -> Say | Refuse:
    if value == 1:
        return Say()
    return Refuse(
        "Sana's train.py has a gc_step whose grouping autofit has not measured against its "
        "own; SimpleTuner's Sana checkpoints every N-th block",
        EVERY_BLOCK,
    )


class CheckpointInterval(Knob):
    name = "checkpoint_interval"
    depends_on = ("checkpoint_stride", "checkpointing", "swap_blocks", "train_mode", "world_size")
    default = 1
    help = (
        "with checkpointing: checkpoint every N blocks, N contiguous blocks under one call (SD3, "
        "Flux) or every N-th block alone (Sana), as SimpleTuner's gradient_checkpointing_interval; "
        "every N-th layer alone for language models (torchtitan's selective_ac_option=N)"
    )
    kind = int
    minimum = 1
    reach = "pass"  # what forward saves and backward recomputes
    writes = ("checkpoint_plan",)

    def means(self, value: Any, subject: Subject) -> str:
        groups = family(subject.family).checkpoint_groups
        if value == 1:
            return "gradient checkpointing on every block"
        if groups == "segments":
            return f"each {value} contiguous blocks checkpointed under one call"
        if groups == "layers":
            return f"every {_ordinal(value)} layer checkpointed, counted from 1, the others not"
        return f"every {_ordinal(value)} block checkpointed, the others not"

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return bool(config.get("checkpointing"))

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        # Fewer blocks checkpointed hold more and recompute less: a smaller interval than another
        # the search tries only saves memory. (SimpleTuner's segments recompute every block of
        # theirs whatever the interval: a space tries an interval there with a stride.)
        larger = [v for v in searched if v > value]
        return min(larger) if larger else None

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value == 1:
            return None
        if not context.knobs.get("checkpointing"):
            return f"checkpoint_interval={value} needs checkpointing=true"
        if not family(context.model.family).checkpoint_groups:
            return (
                f"checkpoint_interval={value}: the {context.model.family} family checkpoints "
                f"every block; an interval exists for {', '.join(declaring('checkpoint_groups'))}"
            )
        if context.knobs.get("swap_blocks"):
            return (
                f"checkpoint_interval={value} with swap_blocks: SimpleTuner falls back to every "
                "block's own call when it swaps blocks, and autofit has not modelled that"
            )
        return None

    def apply(self, run: RunState, value: Any) -> None:
        if value > 1 and run.knobs.get("checkpointing"):
            groups = family(run.preset.family).checkpoint_groups
            assert groups, f"checkpoint_interval={value} for a family without groups"
            stride = int(run.knobs.get("checkpoint_stride", 0))
            run.checkpoint_plan = CheckpointPlan(run, int(value), stride, groups)

    trainers = {
        "simpletuner": lambda v, s: Say() if v == 1 else say(gradient_checkpointing_interval=v),
        "sana": _sana,
        "trl": _every_layer("TRL"),
        "axolotl": _every_layer("axolotl"),
        "torchtune": _torchtune,
        # the blocks LitGPT checkpoints (checkpointing's words) are every one of them
        "litgpt": lambda v, s: (
            Say()
            if v == 1
            else Refuse("LitGPT checkpoints every block when it checkpoints at all", EVERY_BLOCK)
        ),
        "llamafactory": _every_layer("LLaMA-Factory"),
    }
