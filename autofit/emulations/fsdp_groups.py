"""The `fully_shard` calls accelerate 1.15's fsdp2_prepare_model makes for FSDP2 (autofit/knobs/
fsdp/): each block, an untied input embedding, the tail (final norm, output head) and the root,
each with the parameters it manages. Both the emulation (autofit/emulations/fsdp.py) and the real
sharding (fsdp_real.py) read them.

Known limitations: the blocks are the preset's `blocks` lists, not the classes accelerate's
TRANSFORMER_BASED_WRAP matches anywhere in the model (`_no_split_modules` or
`fsdp_transformer_layer_cls_to_wrap`); SIZE_BASED_WRAP and NO_WRAP are not followed. Under LoRA
the adapters shard with their block. The HF Trainer swaps in PEFT's policy for a PEFT model
(transformers' `update_fsdp_plugin_peft`), which accelerate's FSDP2 path does not recognise
(`fsdp2_prepare_auto_wrap_policy` returns None): there no block is a group of its own, which
these groups do not follow."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from autofit.models import ModelPreset


@dataclass
class Group:
    """The modules one `fully_shard` call takes, and whether they reshard after forward."""

    modules: list[nn.Module]
    reshard_after_forward: bool
    params: list[nn.Parameter] = field(default_factory=list)


def _call(model: nn.Module, method: str) -> Any:
    try:
        return getattr(model, method, lambda: None)()
    except NotImplementedError:  # transformers' base class for models without embeddings
        return None


def final_norm(model: nn.Module) -> nn.Module | None:
    """accelerate's `_find_final_norm`: the last child of the base model whose class is a norm."""
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else model
    if not isinstance(base, nn.Module):
        return None
    found = None
    for _, module in base.named_children():
        if "Norm" in type(module).__name__:
            found = module
    return found


def fsdp_groups(model: nn.Module, preset: ModelPreset, reshard_after_forward: bool) -> list[Group]:
    """The `fully_shard` calls accelerate 1.15's fsdp2_prepare_model makes, in its order, each
    with the parameters it manages (those no earlier call took; a tied weight once)."""
    groups = [
        Group([block], reshard_after_forward)
        for path in preset.blocks
        for block in model.get_submodule(path)
    ]
    embed, head = _call(model, "get_input_embeddings"), _call(model, "get_output_embeddings")
    tied = embed is not None and head is not None and embed.weight is head.weight
    if embed is not None and not tied:
        groups.append(Group([embed], reshard_after_forward))
    wrapped = {id(m) for g in groups for m in g.modules}
    tail = [final_norm(model), embed, head] if tied else [final_norm(model), head]
    tail = [m for m in dict.fromkeys(tail) if m is not None and id(m) not in wrapped]
    if tail:
        groups.append(Group(tail, False))
    groups.append(Group([model], False))  # the root: FSDP2 never reshards it after forward
    taken: set[int] = set()
    for group in groups:
        for module in group.modules:
            for param in module.parameters():
                if id(param) not in taken:
                    taken.add(id(param))
                    group.params.append(param)
    return groups
