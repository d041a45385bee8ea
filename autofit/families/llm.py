"""Causal language models of transformers (Llama, Qwen, their mixtures of experts)."""

from __future__ import annotations

from autofit.families.base import (
    AxolotlModel,
    Family,
    LitGptModel,
    LlamaFactoryModel,
    TorchtuneModel,
    TrlModel,
)
from autofit.words import Refuse

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")

LLM = Family(
    name="llm",
    workload="autofit.workloads.llm",
    libraries=("transformers",),
    loader="transformers",
    unit="tokens",
    companions=(),
    lora_sets={"qv": ("q_proj", "v_proj"), "attention": ATTENTION, "mlp": MLP, "all_linear": ATTENTION + MLP},
    feed_forward=MLP,
    causal_lm=True,
    # torchtitan's selective layer checkpointing (activation_checkpoint.mode="selective",
    # selective_ac_option="N"), as torchtune copied it: every N-th layer wrapped, counted from 1.
    checkpoint_groups="layers",
    trainers={
        "diffusers": Refuse("the diffusers examples train image models only"),
        "kohya": Refuse("sd-scripts trains image models only"),
        "simpletuner": Refuse("autofit exports SimpleTuner's image models only"),
        "sana": Refuse("Sana's train.py trains Sana models only"),
        "trl": TrlModel("AutoModelForCausalLM"),
        "axolotl": AxolotlModel("AutoModelForCausalLM"),
        "torchtune": TorchtuneModel(),
        "litgpt": LitGptModel(),
        "llamafactory": LlamaFactoryModel("AutoModelForCausalLM"),
        "musubi": Refuse("musubi-tuner trains image and video diffusion models"),
        "ai_toolkit": Refuse("ai-toolkit trains image, video and audio diffusion models"),
        "onetrainer": Refuse("OneTrainer trains image and video diffusion models"),
    },
)  # fmt: skip
