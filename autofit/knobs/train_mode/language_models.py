"""train_mode's words in the language-model trainers' configs (TRL, axolotl, torchtune, LitGPT,
LLaMA-Factory): how each trains the whole model, its adapters or its last layers, and what each
refuses. The knob itself, with the other trainers' words, is the package's __init__."""

from __future__ import annotations

from typing import Any

from autofit.families.torchtune_builders import builder_for
from autofit.knobs.base import Refuse, Say, Subject, say
from autofit.knobs.lycoris_config import LYCORIS_MODE
from autofit.knobs.peft_config import PEFT_MODE
from autofit.knobs.train_mode.shared import (
    DORA_MODES,
    FOUR_BIT_MODES,
    NO_LYCORIS_FILE,
    NO_PEFT_FILE,
)


def trl(value: Any, s: Subject) -> Say | Refuse:
    """TRL's ModelConfig fields for the adapters (its train.py builds LoraConfig and
    BitsAndBytesConfig from them): peft's LoRA without dropout, alpha = rank as measured; a 4-bit
    base in NF4 with double quantization, stored in bf16 where ZeRO-3 or FSDP shards it."""
    if value == "full":
        return say(use_peft=False)
    if value == "freeze":
        return Refuse(
            "TRL's SFTTrainer trains the whole model or PEFT adapters, not the last blocks"
        )
    if value == "peft":
        return NO_PEFT_FILE("autofit's TRL export")
    if value == LYCORIS_MODE:
        return NO_LYCORIS_FILE("TRL")
    settings: dict[str, Any] = {
        "use_peft": True,
        "lora_dropout": 0.0,
        "use_dora": value in DORA_MODES,
    }
    if value in FOUR_BIT_MODES:
        settings.update(load_in_4bit=True, bnb_4bit_quant_type="nf4", use_bnb_nested_quant=True)
        if s.config.get("zero_stage") == 3 or s.config.get("fsdp", "off") != "off":
            settings["bnb_4bit_quant_storage"] = "bfloat16"
    warning = ""
    if value == "qdora":
        warning = (
            "TRL keeps DoRA's magnitude vectors in fp32 on a 4-bit base (one value per output "
            "feature: kilobytes a layer) where the measured run kept them in bf16"
        )
    return Say(settings=settings, warning=warning)


# axolotl 0.19 turns its fused LoRA kernels on for LoRA and QLoRA unless told (utils/schemas/
# config.py check_auto_enable_lora_kernels): off, so peft's layers run as measured.
AXOLOTL_NO_KERNELS = {
    "lora_mlp_kernel": False,
    "lora_qkv_kernel": False,
    "lora_o_kernel": False,
    "lora_embedding_kernel": False,
}


def axolotl(value: Any, s: Subject) -> Say | Refuse:
    """axolotl's adapter settings (loaders/adapter.py builds peft's LoraConfig from them; loaders/
    model.py the BitsAndBytesConfig): no dropout, alpha = rank as measured (lora_rank's words); a
    4-bit base in NF4 with double quantization, its compute dtype the model's (precision's)."""
    if value == "full":
        return Say()
    if value == "freeze":
        return Refuse(
            "autofit exports axolotl's adapters and full fine-tunes; its unfrozen_parameters "
            "patterns are not mapped to the last blocks"
        )
    if value == PEFT_MODE:
        return NO_PEFT_FILE("autofit's axolotl export")
    if value == LYCORIS_MODE:
        return NO_LYCORIS_FILE("axolotl")
    settings: dict[str, Any] = {"adapter": "lora", "lora_dropout": 0.0, **AXOLOTL_NO_KERNELS}
    if value in FOUR_BIT_MODES:
        settings.update(
            adapter="qlora",
            load_in_4bit=True,
            bnb_config_kwargs={"bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True},
        )
    if value in DORA_MODES:
        settings["peft_use_dora"] = True
    return Say(settings=settings)


# torchtune 0.6.1's 4-bit base is torchao's NF4Tensor (modules/peft/lora.py to_nf4): NF4 in blocks
# of 64 like bitsandbytes', but its scales linearly quantized to int8 around their mean, and every
# forward and backward dequantizes the whole weight eagerly through two int64 index tensors of
# half its values each (torchao 0.10.0 dtypes/nf4tensor.py get_original_weight, still so in
# 0.18): four times the bf16 weight's bytes in temporaries where bitsandbytes' kernel makes the
# weight alone.
TORCHTUNE_NF4 = Refuse(
    "torchtune's 4-bit base is torchao's NF4Tensor, whose eager dequantization makes int64 index "
    "temporaries four times the layer's bf16 weight, not the bitsandbytes NF4 layer measured"
)


def torchtune(value: Any, s: Subject) -> Say | Refuse:
    """The model's builder (autofit/families/torchtune_builders.py): the full one, or its LoRA
    builder with no dropout and torchtune's DoRA (modules/peft/dora.py, peft's formulation) where
    asked; alpha = rank as measured (lora_rank's words)."""
    if value in FOUR_BIT_MODES:
        return TORCHTUNE_NF4
    if value == "freeze":
        return Refuse("torchtune trains the whole model or its LoRA and DoRA adapters")
    if value == PEFT_MODE:
        return NO_PEFT_FILE("autofit's torchtune export")
    if value == LYCORIS_MODE:
        return NO_LYCORIS_FILE("torchtune")
    builder = builder_for(s.preset)
    if builder is None:
        return Refuse(f"torchtune 0.6.1 has no model builder of {s.model}'s architecture")
    if value == "full":
        return say(**{"model._component_": builder.component(adapters=False)})
    return say(
        **{
            "model._component_": builder.component(adapters=True),
            "model.lora_dropout": 0.0,
            "model.use_dora": value in DORA_MODES,
        }
    )


# litgpt 0.5.13's 4-bit base (finetune/lora.py main): Lightning's BitsandbytesPrecision replaces
# every Linear built under it, the output head too, and once the optimizer exists LitGPT swaps the
# token embedding for bitsandbytes' StableEmbedding, whose weight then takes a gradient in every
# backward (it is trainable and in no optimizer).
LITGPT_4BIT = (
    "LitGPT's --quantize quantizes the output head too and swaps the token embedding for "
    "bitsandbytes' StableEmbedding after freezing, whose vocabulary x hidden weight then takes a "
    "gradient every step (finetune/lora.py): not the measured 4-bit base"
)


def litgpt(value: Any, s: Subject) -> Say | Refuse:
    """litgpt 0.5.13: `finetune_full` trains every weight, `finetune_lora` its own LoRA layers
    (lora.py; the layout picks the command); no dropout, as measured."""
    if value == "full":
        return Say()
    if value == "lora":
        return say(lora_dropout=0.0)
    why = {
        "qlora": LITGPT_4BIT,
        "qdora": LITGPT_4BIT,
        "dora": "LitGPT's LoRA layers have no DoRA magnitude",
        "freeze": "LitGPT's finetune scripts train every weight, LoRA or adapters, never the "
        "last blocks alone",
    }
    if value == PEFT_MODE:
        return NO_PEFT_FILE("LitGPT")
    if value == LYCORIS_MODE:
        return NO_LYCORIS_FILE("LitGPT")
    return Refuse(why[value])


def llamafactory(value: Any, s: Subject) -> Say | Refuse:
    """LLaMA-Factory 0.9.5's finetuning_type (model/adapter.py init_adapter): full, freeze (the last
    freeze_trainable_layers layers: trainable_layers' words) or lora, whose LoraConfig it builds
    from lora_rank, lora_alpha, lora_target, lora_dropout and use_dora; a 4-bit base is
    bitsandbytes' NF4 with double quantization, computed and stored in its compute dtype
    (model/model_utils/quantization.py)."""
    if value in ("full", "freeze"):
        return say(finetuning_type=value)
    if value == PEFT_MODE:
        return NO_PEFT_FILE("autofit's LLaMA-Factory export")
    if value == LYCORIS_MODE:
        return NO_LYCORIS_FILE("LLaMA-Factory")
    settings: dict[str, Any] = {"finetuning_type": "lora", "lora_dropout": 0.0}
    if value in DORA_MODES:
        settings["use_dora"] = True
    if value in FOUR_BIT_MODES:
        settings.update(
            quantization_bit=4,
            quantization_method="bnb",
            quantization_type="nf4",
            double_quantization=True,
        )
    return Say(settings=settings)
