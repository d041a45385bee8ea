"""lora_rank: the rank of the LoRA or DoRA adapters (train_mode lora, qlora, dora, qdora;
meaningless otherwise)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autofit.knobs.base import Knob, Subject, say
from autofit.knobs.lora_targets import ADAPTER_MODES
from autofit.models import ModelPreset


class LoraRank(Knob):
    name = "lora_rank"
    depends_on = ("train_mode",)
    default = 16
    help = "rank of the LoRA or DoRA adapters (train_mode=lora, qlora, dora or qdora)"
    kind = int
    minimum = 1
    per_sample_memory = False
    default_asks_nothing = False  # trainers' own default ranks differ (the diffusers scripts' is 4)
    # train_mode's apply reads it (the adapters are built there).

    def means(self, value: Any, subject: Subject) -> str:
        return "the rank of the LoRA adapters"

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return config.get("train_mode", "full") in ADAPTER_MODES

    trainers = {
        "simpletuner": lambda v, s: say(lora_rank=v),
        "kohya": lambda v, s: say(network_dim=v, network_alpha=v),
        "diffusers": lambda v, s: say(**{"--rank": v}),
        "trl": lambda v, s: say(lora_r=v, lora_alpha=v),  # alpha = rank, as measured
        "axolotl": lambda v, s: say(lora_r=v, lora_alpha=v),
        "torchtune": lambda v, s: say(**{"model.lora_rank": v, "model.lora_alpha": v}),
        "litgpt": lambda v, s: say(lora_r=v, lora_alpha=v),
        # said outright: LLaMA-Factory's lora_alpha defaults to twice the rank (finetuning_args.py)
        "llamafactory": lambda v, s: say(lora_rank=v, lora_alpha=v),
        "musubi": lambda v, s: say(**{"--network_dim": v, "--network_alpha": v}),
        "ai_toolkit": lambda v, s: say(**{"network.linear": v, "network.linear_alpha": v}),
        "onetrainer": lambda v, s: say(lora_rank=v, lora_alpha=float(v)),
    }
