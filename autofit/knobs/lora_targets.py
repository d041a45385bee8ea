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

import re
from collections.abc import Mapping
from typing import Any

from autofit.families import REGISTRY, ai_toolkit, diffusers, musubi, simpletuner
from autofit.families.llm import ATTENTION, MLP
from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.models import ModelPreset

ADAPTER_MODES = ("lora", "qlora", "dora", "qdora")  # the train_mode values that train adapters


def _sets(preset: ModelPreset) -> Mapping[str, tuple[str, ...]]:
    """The module sets autofit knows for the preset's family (its declaration's `lora_sets`)."""
    return REGISTRY[preset.family].lora_sets if preset.family in REGISTRY else {}


def target_modules(value: str, preset: ModelPreset) -> list[str] | str:
    """The module names LoRA adapts for this value on this model, or a regular expression over
    their full names (PEFT's target_modules as a string) where a set names one block list."""
    if value == "preset":
        return list(preset.lora_targets)
    names = _sets(preset)[value]
    return names if isinstance(names, str) else list(names)


def _diffusers(value: Any, s: Subject) -> Say | Refuse:
    if value == "preset":
        return Say()
    scripts = diffusers(s.family)
    if scripts is None or not scripts.lora_layers:
        return Refuse(
            f"the diffusers {s.family} LoRA script adapts a fixed set of modules",
            "lora_targets=preset",
        )
    modules = target_modules(value, s.preset)
    if isinstance(modules, str):
        return Refuse(
            f"the diffusers {s.family} LoRA script's --lora_layers names modules in every block, "
            "not one list of blocks",
            "lora_targets=preset, attention, joint_attention, all_linear",
        )
    return say(**{"--lora_layers": ",".join(modules)})


def _simpletuner(value: Any, s: Subject) -> Say | Refuse:
    """SimpleTuner adapts its model's own default modules (Flux: flux_lora_target=all): the
    value that names those says nothing; any other is refused, naming the one that does."""
    model = simpletuner(s.family)
    own = model.lora_targets if model is not None else None
    if own is None:  # the preset lists them
        own = tuple(s.preset.lora_targets)
    names = ("preset", *_sets(s.preset))
    matching = [
        v
        for v in names
        if not isinstance(target_modules(v, s.preset), str)
        and set(target_modules(v, s.preset)) == set(own)
    ]
    if value in matching:
        return Say()
    return Refuse(
        f"SimpleTuner's LoRA adapts {', '.join(own)} of {s.model} by default",
        ", ".join(f"lora_targets={v}" for v in matching),
    )


def _musubi(value: Any, s: Subject) -> Say | Refuse:
    """musubi-tuner's LoRA adapts every linear of the blocks (networks/lora_wan.py: Wan's
    WanAttentionBlock; networks/lora.py: HunyuanVideo's dual- and single-stream blocks): the
    family's all_linear, and the values that name the same modules."""
    scripts = musubi(s.family)
    if scripts is not None and scripts.lora_differs:
        if value == "all_linear":
            return Say(warning=scripts.lora_differs)
        return Refuse(scripts.lora_differs, "lora_targets=all_linear")
    own = _sets(s.preset).get("all_linear")
    names = ("preset", *_sets(s.preset))
    matching = [
        v
        for v in names
        if own is not None
        and not isinstance(own, str)
        and not isinstance(target_modules(v, s.preset), str)
        and set(target_modules(v, s.preset)) == set(own)
    ]
    if value in matching:
        return Say()
    return Refuse(
        f"musubi-tuner's LoRA adapts every linear of {s.model}'s blocks",
        ", ".join(f"lora_targets={v}" for v in matching) or "lora_targets=all_linear",
    )


# ai-toolkit's LoRA network (toolkit/lora_special.py at 27a03a91) adapts every linear of a
# transformer's blocks (`transformer_only`) and of an SD UNet, unless its network_kwargs'
# `only_if_contains` names substrings of the modules' full names to keep.
AI_TOOLKIT_EVERY_LINEAR = ("flux", "chroma")  # the families whose all_linear that is
# A set given as a regular expression over one block list, as one substring of their names.
AI_TOOLKIT_BLOCK_LISTS = {"single_blocks": "single_transformer_blocks"}


def _ai_toolkit(value: Any, s: Subject) -> Say | Refuse:
    model = ai_toolkit(s.family)
    if model is not None and model.lora_differs:
        if value == "all_linear":
            return Say(warning=model.lora_differs)
        return Refuse(model.lora_differs, "lora_targets=all_linear")
    if value == "all_linear" and s.family in AI_TOOLKIT_EVERY_LINEAR:
        return Say()  # its own default: every linear of the blocks
    modules = target_modules(value, s.preset)
    if isinstance(modules, str):
        if value not in AI_TOOLKIT_BLOCK_LISTS:
            return Refuse(f"ai-toolkit's only_if_contains cannot name {value}'s modules")
        modules = [AI_TOOLKIT_BLOCK_LISTS[value]]
    # a substring of the full name: each name here is a module's own last name or a block list
    return say(**{"network.network_kwargs": {"only_if_contains": list(modules)}})


# torchtune 0.6.1's LoRA builders name the attention projections they adapt (lora_attn_modules,
# its own names) and adapt the feed-forward's three projections all or none (apply_lora_to_mlp);
# the output head stays unadapted (apply_lora_to_output false), as autofit's sets leave it.
TORCHTUNE_ATTENTION = {
    "q_proj": "q_proj",
    "k_proj": "k_proj",
    "v_proj": "v_proj",
    "o_proj": "output_proj",
}
TORCHTUNE_MLP = ("gate_proj", "up_proj", "down_proj")


def _torchtune(value: Any, s: Subject) -> Say | Refuse:
    modules = target_modules(value, s.preset)
    names = set() if isinstance(modules, str) else set(modules)
    mlp = names & set(TORCHTUNE_MLP)
    if (
        isinstance(modules, str)
        or names - set(TORCHTUNE_ATTENTION) - mlp
        or mlp not in (set(), set(TORCHTUNE_MLP))
    ):
        return Refuse(
            "torchtune's LoRA builders adapt named attention projections (q_proj, k_proj, v_proj, "
            "output_proj) and the feed-forward's three projections together"
        )
    return say(
        **{
            "model.lora_attn_modules": [
                TORCHTUNE_ATTENTION[n] for n in TORCHTUNE_ATTENTION if n in names
            ],
            "model.apply_lora_to_mlp": bool(mlp),
            "model.apply_lora_to_output": False,
        }
    )


# litgpt 0.5.13's LoRA flags (finetune/lora.py setup; lora.py builds them on its fused qkv
# projection, the attention's output projection and the MLP's three linears at once).
LITGPT_ATTENTION = dict(
    zip(ATTENTION, ("lora_query", "lora_key", "lora_value", "lora_projection"), strict=True)
)


def _litgpt(value: Any, s: Subject) -> Say | Refuse:
    modules = target_modules(value, s.preset)
    if isinstance(modules, str) or not set(modules) <= set(ATTENTION) | set(MLP):
        return Refuse(
            "LitGPT's LoRA flags name a language model's query, key, value and output "
            "projections, its MLP and its head"
        )
    mlp = set(modules) & set(MLP)
    if mlp and mlp != set(MLP):
        return Refuse("LitGPT's lora_mlp adapts the MLP's three projections together")
    flags = {flag: name in modules for name, flag in LITGPT_ATTENTION.items()}
    return say(**flags, lora_mlp=bool(mlp), lora_head=False)


def _onetrainer(value: Any, s: Subject) -> Say:
    """OneTrainer's layer_filter (modules/module/LoRAModule.py at 23df3832): comma-separated
    patterns, each searched in the full names of the model part's Linear and Conv2d modules; as
    regular expressions anchored at the end of a name, they select what peft's target_modules
    select (a name, or a name's last parts after a dot; a string: the full name)."""
    modules = target_modules(value, s.preset)
    if isinstance(modules, str):
        patterns = [f"^(?:{modules})$"]
    else:
        patterns = [rf"(?:^|\.){re.escape(name)}$" for name in modules]
    assert not any("," in p for p in patterns), "OneTrainer splits its layer_filter at commas"
    return say(
        layer_filter=",".join(patterns), layer_filter_regex=True, layer_filter_preset="custom"
    )


class LoraTargets(Knob):
    name = "lora_targets"
    depends_on = ("train_mode",)
    default = "preset"
    help = (
        "modules the LoRA adapters adapt: preset | qv | attention | joint_attention | mlp | "
        "all_linear | single_blocks (Flux's single-stream blocks only)"
    )
    values = {
        "preset": "the modules the preset lists",
        "qv": "the attention's query and value projections",
        "attention": "every attention projection",
        "joint_attention": "every attention projection of both streams, image and text",
        "mlp": "the feed-forward projections",
        "all_linear": "every linear projection of the blocks",
        "single_blocks": "every linear projection of Flux's single-stream blocks, none of its "
        "double-stream ones (sd-scripts' train_blocks=single)",
    }
    per_sample_memory = True  # adapted layers keep their inputs for backward

    def means(self, value: Any, subject: Subject) -> str:
        what = f"LoRA adapters on {self.values[value]}"  # type: ignore[index]
        if value != "preset" and value not in _sets(subject.preset):
            return what
        modules = target_modules(value, subject.preset)
        if isinstance(modules, str):
            return f"{what} (the modules whose full names match {modules})"
        return f"{what} ({', '.join(modules)})"

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
        "kohya": {"preset": Say(), "single_blocks": say(network_args=["train_blocks=single"])},
        "diffusers": _diffusers,
        "trl": lambda v, s: say(lora_target_modules=target_modules(v, s.preset)),
        # the modules named, not lora_target_linear (every linear layer but the output head)
        "axolotl": lambda v, s: say(lora_target_modules=target_modules(v, s.preset)),
        "torchtune": _torchtune,
        "litgpt": _litgpt,
        # LLaMA-Factory's lora_target: module names joined by commas (its `all` finds every
        # linear layer but the output head, model/model_utils/misc.py find_all_linear_modules)
        "llamafactory": lambda v, s: say(lora_target=",".join(target_modules(v, s.preset))),
        "musubi": _musubi,
        "ai_toolkit": _ai_toolkit,
        "onetrainer": _onetrainer,
    }
