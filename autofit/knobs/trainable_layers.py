"""trainable_layers: how many blocks train under train_mode=freeze (meaningless otherwise).

Freeze tuning, as LLaMA-Factory names it (src/llamafactory/model/adapter.py `_setup_freeze_tuning`,
hiyouga/LLaMA-Factory at ff6d4d1): the last N transformer blocks train in full, every other weight
(the earlier blocks, the embeddings, the final norm and the output head) is frozen. Its
`freeze_trainable_layers` defaults to 2; autofit counts the blocks of the preset's `blocks` lists
in the order the forward pass runs them (Flux: its double-stream blocks, then its single-stream
ones), so N counts from the output. LLaMA-Factory's other freeze options (a negative count for the
first N blocks, `freeze_trainable_modules` for part of each block, `freeze_extra_modules` for the
embeddings or the head) are not searched: the default (all of each block, nothing extra) is what
is measured.

Fewer trained blocks hold less: gradients and optimizer state for those blocks only, and the
activations of the frozen blocks before them are never kept, since no gradient flows into them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autofit.errors import ConfigError
from autofit.knobs.base import Knob, ProbeContext, Subject, say
from autofit.models import ModelPreset

if TYPE_CHECKING:
    from torch import nn

LLAMA_FACTORY_DEFAULT = 2  # finetuning_args.freeze_trainable_layers

# Where an architecture says how many blocks a block list holds, by the list's path.
_COUNT_KEYS = {
    "model.layers": ("config", "num_hidden_layers"),  # transformers' causal language models
    "transformer_blocks": ("num_layers",),  # diffusers' transformers (Sana, SD3, Flux's double)
    "single_transformer_blocks": ("num_single_layers",),  # Flux's single-stream blocks
}


def block_count(preset: ModelPreset) -> int | None:
    """How many blocks the preset's block lists hold together, from its architecture without
    building it; None where autofit cannot tell (a custom model: the run checks)."""
    total = 0
    for path in preset.blocks:
        value: Any = preset.architecture
        for key in _COUNT_KEYS.get(path, ("?",)):
            value = value.get(key) if isinstance(value, Mapping) else None
        if not isinstance(value, int):
            return None
        total += value
    return total


def too_many(value: int, count: int, preset: ModelPreset) -> str:
    return f"trainable_layers={value} is more than the {count} blocks of {preset.name}"


def last_blocks(model: nn.Module, preset: ModelPreset, count: int) -> list[nn.Module]:
    """The last `count` blocks of the model, in forward order across the preset's block lists."""
    blocks = [block for path in preset.blocks for block in model.get_submodule(path)]
    if count > len(blocks):
        raise ConfigError(too_many(count, len(blocks), preset))
    return blocks[len(blocks) - count :]


class TrainableLayers(Knob):
    name = "trainable_layers"
    depends_on = ("train_mode",)
    default = LLAMA_FACTORY_DEFAULT
    help = "blocks that train under train_mode=freeze, counted from the output (LLaMA-Factory's 2)"
    kind = int
    minimum = 1
    # Trainers' own defaults differ (or they have none): always say it.
    default_asks_nothing = False
    # Frozen blocks before the first trained one keep no activations: the slope moves with it.
    per_sample_memory = True
    # train_mode's apply reads it (it decides which weights train).

    def means(self, value: Any, subject: Subject) -> str:
        return (
            f"train the last {value} blocks of {' and '.join(subject.preset.blocks) or 'the model'} "
            "in full; freeze the other blocks, the embeddings and the output head"
        )

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return config.get("train_mode", "full") == "freeze"

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        # Fewer trained blocks only save memory (the run trains less): worth it at batches the
        # next larger count the search tries cannot fit.
        more = [v for v in searched if v > value]
        return min(more) if more else None

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if not self.applies(context.knobs, context.model):
            return None
        count = block_count(context.model)
        if count is not None and value > count:
            return too_many(value, count, context.model)
        return None

    # LLaMA-Factory's own count of the last layers its freeze tuning trains (every module of each,
    # nothing else: freeze_trainable_modules all, no freeze_extra_modules, as measured).
    trainers = {"llamafactory": lambda v, s: say(freeze_trainable_layers=v)}
