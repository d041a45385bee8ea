"""The units PyTorch FSDP1 wraps a model into, as accelerate's `fsdp_version: 1`, the HF Trainer
and Lightning's FSDPStrategy configure it: transformer-block auto-wrap, under LoRA each trained
adapter layer a unit of its own (PEFT's `fsdp_auto_wrap_policy`), the root unit holding the rest.
Both the emulation (autofit/emulations/fsdp1.py) and the real wrapping (fsdp1_real.py) read them.

Known limitations: the blocks are the preset's `blocks` lists, not the classes the wrap policy
matches anywhere in the model (`_no_split_modules`, `fsdp_transformer_layer_cls_to_wrap` or
PEFT's `FSDP_TRANSFORMER_CLS_TO_WRAP`); PEFT's lambda policy is applied only inside those blocks
(a trained leaf outside them, e.g. an adapted output head, stays in the root unit), and its
prompt-learning encoders (`PrefixEncoder`, `PromptEmbedding`...) are not wrapped; size-based
auto-wrap is not followed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from autofit.models import ModelPreset


@dataclass
class Unit:
    """One FullyShardedDataParallel instance: its module and the weights its flat parameter
    takes (those of no unit nested in it; a tied weight once)."""

    module: nn.Module
    params: list[tuple[nn.Module, str, nn.Parameter]] = field(default_factory=list)
    shared: list[tuple[nn.Module, str, int]] = field(default_factory=list)  # -> index in params


def _adapter_layers(block: nn.Module) -> list[nn.Module]:
    """PEFT's fsdp_auto_wrap_policy: a leaf module whose weight trains is a unit of its own."""
    return [
        m
        for m in block.modules()
        if not list(m.children())
        and getattr(m, "weight", None) is not None
        and getattr(m.weight, "requires_grad", False)
    ]


def fsdp1_units(model: nn.Module, preset: ModelPreset) -> list[Unit]:
    """FSDP1's units in the order `_recursive_wrap` makes them (children first, the root last):
    each transformer block, preceded by its trained adapter layers when a frozen base has them."""
    blocks = [block for path in preset.blocks for block in model.get_submodule(path)]
    frozen_base = any(not p.requires_grad for p in model.parameters())
    modules: list[nn.Module] = []
    for block in blocks:
        if frozen_base:
            modules += _adapter_layers(block)
        modules.append(block)
    modules.append(model)
    units = [Unit(m) for m in modules]
    owner: dict[int, Unit] = {}
    for unit in units:  # innermost first: a module's weights belong to the first unit over it
        for module in unit.module.modules():
            owner.setdefault(id(module), unit)
    seen: dict[int, tuple[Unit, int]] = {}
    for _name, module in model.named_modules(remove_duplicate=False):
        for pname, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) in seen:  # a tied weight: one more view of the first one
                unit, index = seen[id(param)]
                unit.shared.append((module, pname, index))
                continue
            unit = owner[id(module)]
            seen[id(param)] = (unit, len(unit.params))
            unit.params.append((module, pname, param))
    for unit in units:
        grads = {p.requires_grad for _, _, p in unit.params}
        if len(grads) > 1:
            raise ValueError(
                f"FSDP1 with use_orig_params=False flattens {type(unit.module).__name__}'s "
                "weights into one parameter, which cannot mix frozen and trained weights"
            )
    return [u for u in units if u.params or u.module is model]
