"""optimizer's words in the language-model trainers' configs (TRL and LLaMA-Factory through
transformers' optimizer names, axolotl, torchtune, LitGPT): the optimizer each builds, and what
each refuses. The knob itself, with the other trainers' words, is the package's __init__."""

from __future__ import annotations

from typing import Any

from autofit.knobs.base import Refuse, Say, Subject, say
from autofit.knobs.optimizer.shared import LORAFA_IN_CODE

# transformers' `optim` names (OptimizerNames, trainer_optimizer.py) that build the update the
# probe ran, with their `optim_args`; AdamW's implementation decides its name (trl).
TRL = {
    "adamw8bit": ("adamw_bnb_8bit", None),
    "paged_adamw8bit": ("paged_adamw_8bit", None),
    # relative_step and scale_parameter off, warmup_init at its default (off), as built here
    "adafactor": ("adafactor", None),
    "lion8bit": ("lion_8bit", None),
    "paged_lion8bit": ("paged_lion_8bit", None),
    "sgd": ("sgd", "momentum=0.9"),
}


def trl(value: Any, s: Subject) -> Say | Refuse:
    if s.config.get("offload_optimizer", "none") != "none" and value != "adamw":
        return Refuse(
            "under ZeRO-Offload accelerate swaps the Trainer's optimizer for DeepSpeed's CPU "
            "Adam; autofit measured offload only with optimizer=adamw"
        )
    if value == "adamw":
        fused = s.config.get("optimizer_impl", "fused") == "fused"
        return say(optim="adamw_torch_fused" if fused else "adamw_torch")
    if value not in TRL:
        why = {
            "lion": "that holds what the probe's did (its lion_32bit keeps fp32 state whatever "
            "the weights' dtype)",
            "lorafa": f"({LORAFA_IN_CODE}, passed to the trainer as its optimizers)",
        }
        return Refuse(f"transformers' optimizers have no {value} {why.get(value, '')}".strip())
    name, arguments = TRL[value]
    return say(optim=name, **({"optim_args": arguments} if arguments else {}))


def axolotl(value: Any, s: Subject) -> Say | Refuse:
    """axolotl 0.19 hands its `optimizer` to transformers as `optim` (core/builders/base.py), so
    transformers' names are TRL's words; of its own names, came_pytorch builds the CAME measured."""
    if value == "adamw8bit" and s.config.get("fsdp", "off") != "off":
        return Refuse(
            "axolotl refuses adamw_bnb_8bit under FSDP2 (utils/schemas/validation.py "
            "check_fsdp2_w_8bit_optimizer: bitsandbytes' kernels fail on its sharded parameters)"
        )
    if value == "came" and s.config.get("offload_optimizer", "none") == "none":
        return say(optimizer="came_pytorch")
    words = trl(value, s)
    if isinstance(words, Refuse):
        return words
    settings = dict(words.settings)
    return Say(settings={"optimizer": settings.pop("optim"), **settings}, note=words.note)


# torchtune instantiates its optimizer section's _component_ with the model's parameters and the
# section's other keys (config.instantiate): each class and the arguments autofit built it with
# (RULES); AdamW's implementation is optimizer_impl's words.
TORCHTUNE: dict[str, dict[str, Any]] = {
    "adamw": {"_component_": "torch.optim.AdamW", "weight_decay": 0.01},
    "adamw8bit": {"_component_": "bitsandbytes.optim.AdamW8bit"},
    "paged_adamw8bit": {"_component_": "bitsandbytes.optim.PagedAdamW8bit"},
    "adafactor": {
        "_component_": "transformers.optimization.Adafactor",
        "relative_step": False,
        "scale_parameter": False,
        "warmup_init": False,
    },
    "came": {"_component_": "came_pytorch.CAME", "weight_decay": 0.01},
    "lion": {"_component_": "lion_pytorch.Lion", "weight_decay": 0.01},
    "lion8bit": {"_component_": "bitsandbytes.optim.Lion8bit"},
    "paged_lion8bit": {"_component_": "bitsandbytes.optim.PagedLion8bit"},
    "sgd": {"_component_": "torch.optim.SGD", "momentum": 0.9, "foreach": True},
}


def torchtune(value: Any, s: Subject) -> Say | Refuse:
    if value not in TORCHTUNE:
        why = {
            "adamw_bf16": "autofit has not matched torchao's AdamW(bf16_stochastic_round=True) "
            "to the stochastic-rounding AdamW it measured",
            "lorafa": LORAFA_IN_CODE,
        }
        return Refuse(f"torchtune has no {value}: {why[value]}")
    return Say(settings={f"optimizer.{k}": v for k, v in TORCHTUNE[value].items()})


# litgpt 0.5.13 builds `optimizer` as class_path and init_args (utils.py
# instantiate_torch_optimizer: any importable class, its arguments filtered by its signature), so
# each rule is the class the probe built, with the arguments that make it that rule.
LITGPT: dict[str, tuple[str, dict[str, Any]]] = {
    "adamw": ("torch.optim.AdamW", {}),  # its implementation: optimizer_impl's words
    "adamw8bit": ("bitsandbytes.optim.AdamW8bit", {}),
    "paged_adamw8bit": ("bitsandbytes.optim.PagedAdamW8bit", {}),
    "adafactor": (
        "transformers.optimization.Adafactor",
        {"relative_step": False, "scale_parameter": False, "warmup_init": False},
    ),
    "came": ("came_pytorch.CAME", {}),
    "lion": ("lion_pytorch.Lion", {}),
    "lion8bit": ("bitsandbytes.optim.Lion8bit", {}),
    "paged_lion8bit": ("bitsandbytes.optim.PagedLion8bit", {}),
    "sgd": ("torch.optim.SGD", {"momentum": 0.9}),
}


def litgpt(value: Any, s: Subject) -> Say | Refuse:
    if value not in LITGPT:
        why = {
            "adamw_bf16": "its stochastic-rounding AdamW is SimpleTuner's own",
            "lorafa": LORAFA_IN_CODE,
        }
        return Refuse(f"LitGPT has no {value}: {why[value]}")
    name, arguments = LITGPT[value]
    return say(
        **{"optimizer.class_path": name},
        **{f"optimizer.init_args.{k}": v for k, v in arguments.items()},
    )
