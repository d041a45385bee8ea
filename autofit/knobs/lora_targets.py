"""lora_targets: which modules the LoRA or DoRA adapters adapt (train_mode lora, qlora, dora, qdora).

`preset` is the list the preset gives (its trainers' usual default); the others name module sets
that published recipes use, per model family: `qv` the attention's query and value projections
(torchtune's and LitGPT's defaults, PEFT's for Llama), `attention` every attention projection (of
the image stream, for the diffusion transformers: SimpleTuner's default for SD3, Sana and SDXL),
`joint_attention` those of both streams of SD3's and Flux's joint attention (SimpleTuner's Flux
default), `mlp` the feed-forward projections, `all_linear` every linear projection of the
blocks. Which modules are adapted decides the activations a step keeps: an adapter's input is
saved for its backward, where a frozen layer saves none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autofit.families import REGISTRY, diffusers, simpletuner
from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.models import ModelPreset

ADAPTER_MODES = ("lora", "qlora", "dora", "qdora")  # the train_mode values that train adapters


def _sets(preset: ModelPreset) -> Mapping[str, tuple[str, ...]]:
    """The module sets autofit knows for the preset's family (its declaration's `lora_sets`)."""
    return REGISTRY[preset.family].lora_sets if preset.family in REGISTRY else {}


def target_modules(value: str, preset: ModelPreset) -> list[str]:
    """The module names LoRA adapts for this value on this model."""
    return list(preset.lora_targets) if value == "preset" else list(_sets(preset)[value])


def _diffusers(value: Any, s: Subject) -> Say | Refuse:
    if value == "preset":
        return Say()
    scripts = diffusers(s.family)
    if scripts is None or not scripts.lora_layers:
        return Refuse(
            f"the diffusers {s.family} LoRA script adapts a fixed set of modules",
            "lora_targets=preset",
        )
    return say(**{"--lora_layers": ",".join(target_modules(value, s.preset))})


def _simpletuner(value: Any, s: Subject) -> Say | Refuse:
    """SimpleTuner adapts its model's own default modules (Flux: flux_lora_target=all): the
    value that names those says nothing; any other is refused, naming the one that does."""
    model = simpletuner(s.family)
    own = model.lora_targets if model is not None else None
    if own is None:  # the preset lists them
        own = tuple(s.preset.lora_targets)
    names = ("preset", *_sets(s.preset))
    matching = [v for v in names if set(target_modules(v, s.preset)) == set(own)]
    if value in matching:
        return Say()
    return Refuse(
        f"SimpleTuner's LoRA adapts {', '.join(own)} of {s.model} by default",
        ", ".join(f"lora_targets={v}" for v in matching),
    )


class LoraTargets(Knob):
    name = "lora_targets"
    default = "preset"
    help = (
        "modules the LoRA adapters adapt: preset | qv | attention | joint_attention | mlp | "
        "all_linear"
    )
    values = {
        "preset": "the modules the preset lists",
        "qv": "the attention's query and value projections",
        "attention": "every attention projection",
        "joint_attention": "every attention projection of both streams, image and text",
        "mlp": "the feed-forward projections",
        "all_linear": "every linear projection of the blocks",
    }
    per_sample_memory = True  # adapted layers keep their inputs for backward

    def means(self, value: Any, subject: Subject) -> str:
        what = f"LoRA adapters on {self.values[value]}"  # type: ignore[index]
        if value != "preset" and value not in _sets(subject.preset):
            return what
        return f"{what} ({', '.join(target_modules(value, subject.preset))})"

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return config.get("train_mode", "full") in ADAPTER_MODES

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if not self.applies(context.knobs, context.model) or value == "preset":
            return None
        known = dict(_sets(context.model))
        config = context.model.architecture.get("config", {})
        if "num_experts" in config or "num_local_experts" in config:
            # A mixture of experts has no dense feed-forward projections: transformers stores its
            # experts as fused 3-D parameters, which peft's target_modules cannot adapt.
            dense = set(REGISTRY[context.model.family].feed_forward)
            known = {k: v for k, v in known.items() if not set(v) & dense}
            if value in _sets(context.model) and value not in known:
                offered = ", ".join(["preset", *known])
                return f"lora_targets={value}: {context.model.name}'s experts are fused 3-D parameters, which peft's target_modules cannot adapt; use {offered}"
        if value not in known:
            offered = ", ".join(["preset", *known])
            return f"lora_targets={value}: autofit knows no such modules of {context.model.name}; it knows {offered}"
        return None

    # train_mode's apply builds the adapters on target_modules(); sd-scripts adapts its own fixed
    # set, which the preset lists, and SimpleTuner its model's default (its family's declaration).
    trainers = {
        "simpletuner": _simpletuner,
        "kohya": {"preset": Say()},
        "diffusers": _diffusers,
        "trl": lambda v, s: say(lora_target_modules=target_modules(v, s.preset)),
    }
