"""precision's words in the language-model trainers' configs (TRL, axolotl, torchtune, LitGPT,
LLaMA-Factory): the dtype each loads and trains the model in, and what each refuses. The knob
itself, with the other trainers' words, is the package's __init__."""

from __future__ import annotations

from typing import Any

from autofit.knobs.base import Refuse, Say, Subject, say
from autofit.knobs.precision.shared import BF16_WEIGHTS
from autofit.knobs.train_mode import FOUR_BIT_MODES

# TRL's ModelConfig dtype the model loads in: the run's weights, or under adapters its frozen base.
TRL_DTYPES = {
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    **dict.fromkeys(BF16_WEIGHTS, "bfloat16"),
}
TRL_ADAPTERS = "precision=bf16"  # what TRL runs for 16-bit LoRA: fp32 adapters, bf16 autocast


def trl(value: Any, s: Subject) -> Say | Refuse:
    """The dtype the model loads in and the HF Trainer's autocast (SFTConfig makes bf16 the
    default, so it is always said). Adapters: PEFT's get_peft_model keeps them in fp32 on a 16-bit
    model (not under ZeRO-3, where TRL asks it not to), and TRL casts those of a 4-bit model to
    bf16 (trl/trainer/sft_trainer.py, 1.16)."""
    mode = s.config.get("train_mode", "full")
    autocast = {"bf16": value in ("bf16", "bf16_autocast"), "fp16": value == "fp16"}
    if s.config.get("zero_stage"):
        if value not in ("bf16", "fp16"):
            return Refuse(
                "ZeRO runs a 16-bit model with fp32 master weights (precision bf16 or fp16); "
                "autofit measured no other precision with zero_stage >= 1"
            )
        return say(dtype=TRL_DTYPES[value], **autocast)
    if mode in ("full", "freeze"):
        dtype = "bfloat16" if value in BF16_WEIGHTS else "float32"
        return say(dtype=dtype, **autocast)
    fp32_adapters = value not in BF16_WEIGHTS  # as the probe trained them
    if mode in ("qlora", "qdora") and fp32_adapters:
        return Refuse(
            "TRL casts the adapters of a 4-bit model to bf16, where the measured run kept them "
            "in fp32",
            "precision=bf16_autocast (bf16 adapters under autocast) or bf16_pure",
        )
    if mode not in ("qlora", "qdora") and not fp32_adapters:
        return Refuse(
            "PEFT keeps LoRA adapters on a 16-bit model in fp32 under TRL (get_peft_model's "
            "autocast_adapter_dtype), where the measured run kept them in bf16",
            TRL_ADAPTERS,
        )
    return say(dtype=TRL_DTYPES[value], **autocast)


# axolotl 0.19 (utils/config/__init__.py resolve_dtype, core/builders/base.py): `bf16` loads the
# model in bf16 and turns on the Trainer's bf16 autocast, `fp16` the same in fp16 with loss
# scaling, `bfloat16` alone loads bf16 with no autocast, neither loads fp32. PEFT keeps the
# adapters of a 16-bit model in fp32 unless peft_autocast_adapter_dtype is false.
AXOLOTL_AUTOCAST = {
    "fp32": {"bf16": False, "fp16": False, "tf32": False},
    "fp16": {"bf16": False, "fp16": True},
    "bf16": {"bf16": True},
    "bf16_autocast": {"bf16": True},
    "bf16_pure": {"bf16": False, "bfloat16": True},
}
# What axolotl's FSDP runs of a full fine-tune: the model loaded in fp32, or in bf16 with or without
# the Trainer's bf16 autocast.
AXOLOTL_FSDP_FULL = ("fp32", "bf16_autocast", "bf16_pure")
AXOLOTL_FULL = (
    "axolotl fine-tunes a model in full in the 16-bit dtype it loads it in, with its token "
    "embedding, output head and norms upcast to fp32 (loaders/model.py "
    "_configure_embedding_dtypes): neither fp32 master weights nor an all-bf16 model as measured"
)


def axolotl(value: Any, s: Subject) -> Say | Refuse:
    mode = s.config.get("train_mode", "full")
    if s.config.get("zero_stage"):
        # DeepSpeed casts the model to 16-bit at initialize and keeps fp32 masters, as measured
        if value not in ("bf16", "fp16"):
            return Refuse(
                "ZeRO runs a 16-bit model with fp32 master weights (precision bf16 or fp16); "
                "autofit measured no other precision with zero_stage >= 1"
            )
        return say(**AXOLOTL_AUTOCAST[value])
    if mode in ("full", "freeze") and s.config.get("fsdp", "off") != "off":
        # Under FSDP axolotl leaves the embeddings in the dtype it loads (loaders/model.py
        # _configure_embedding_dtypes) and its fsdp2_prepare_model casts nothing: every weight is
        # sharded and stepped in that dtype.
        if value not in AXOLOTL_FSDP_FULL:
            return Refuse(
                "under FSDP axolotl shards and steps a full fine-tune's weights in the dtype it "
                "loads them in (its fsdp2_prepare_model casts nothing to fp32): no fp32 master "
                "weights"
            )
        return say(**AXOLOTL_AUTOCAST[value])
    if mode in ("full", "freeze"):
        if value != "fp32":
            return Refuse(AXOLOTL_FULL, "precision=fp32, or bf16 and fp16 with zero_stage >= 1")
        return say(**AXOLOTL_AUTOCAST[value])
    if value == "fp32" and mode in ("qlora", "qdora"):
        return Refuse(
            "axolotl computes a 4-bit base in the dtype it loads the model in (fp32 here: "
            "bnb_4bit_compute_dtype), where the measured run computed it in bf16",
            "precision=bf16, fp16, bf16_autocast, bf16_pure",
        )
    settings = dict(AXOLOTL_AUTOCAST[value])
    if value in BF16_WEIGHTS:  # bf16 adapters, as measured
        settings["peft_autocast_adapter_dtype"] = False
    return Say(settings=settings)


# torchtune 0.6.1's recipes build the whole model, adapters included, in `dtype` (bf16 or fp32;
# fp16 is refused) under training.set_default_dtype and step it with no autocast, no loss scaling
# and no fp32 master weights: autofit's bf16_pure and fp32.
TORCHTUNE_DTYPES = {"fp32": "fp32", "bf16_pure": "bf16"}


def torchtune(value: Any, s: Subject) -> Say | Refuse:
    if value in TORCHTUNE_DTYPES:
        return say(dtype=TORCHTUNE_DTYPES[value])
    return Refuse(
        "torchtune trains the whole model in its dtype (bf16 or fp32) with no autocast and no fp32 "
        "master weights"
    )


# litgpt 0.5.13 hands `precision` to Lightning Fabric 2.6 (finetune/*.py): bf16-true builds the
# model in bf16 and runs it without autocast (plugins/precision/half.py), bf16-mixed and 16-mixed
# build it in fp32 and run it under autocast (amp.py; 16-mixed with a GradScaler), 32-true is fp32.
# A LoRA model is built in one piece, so its frozen base takes the adapters' dtype.
LITGPT_FULL = {
    "fp32": "32-true",
    "fp16": "16-mixed",
    "bf16": "bf16-mixed",
    "bf16_pure": "bf16-true",
}
LITGPT_ADAPTERS = {"fp32": "32-true", "bf16_pure": "bf16-true"}


def litgpt(value: Any, s: Subject) -> Say | Refuse:
    if value == "bf16_autocast":
        return Refuse(
            "Lightning's bf16-true runs the bf16 model without autocast and its bf16-mixed keeps "
            "fp32 weights: LitGPT has no bf16 weights under autocast"
        )
    if s.config.get("train_mode", "full") == "full":
        return say(precision=LITGPT_FULL[value])
    if value in LITGPT_ADAPTERS:
        return say(precision=LITGPT_ADAPTERS[value])
    return Refuse(
        "LitGPT builds a LoRA model in one piece, so under bf16-mixed or 16-mixed its frozen base "
        "is fp32 too, where the measured run froze it in 16-bit"
    )


# LLaMA-Factory 0.9.5 loads the weights in their published dtype (model/loader.py torch_dtype
# "auto": the checkpoint's config.json torch_dtype, which a preset gives as
# trainers.llamafactory.torch_dtype), then casts every trained weight to fp32 unless pure_bf16
# (model/adapter.py init_adapter; not under ZeRO-3 without a 4-bit base, where DeepSpeed keeps
# the fp32 masters); PEFT keeps LoRA adapters on a 16-bit model in fp32 whatever pure_bf16 says
# (get_peft_model's autocast_adapter_dtype). bf16 and fp16 turn the Trainer's autocast on, and
# are the compute dtype of a 4-bit base (hparams/parser.py; neither: bf16 where the GPU has it,
# extras/misc.py infer_optim_dtype).
LLAMAFACTORY_FLAGS = {
    "fp32": {"bf16": False, "fp16": False},
    "fp16": {"fp16": True},
    "bf16": {"bf16": True},
    "bf16_pure": {"pure_bf16": True},
    "bf16_autocast": {"pure_bf16": True, "bf16": True},
}
# The dtype the measured run kept its 16-bit (frozen, or bf16) weights in, as config.json names it.
TORCH_DTYPES = {
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    **dict.fromkeys(BF16_WEIGHTS, "bfloat16"),
}


def llamafactory(value: Any, s: Subject) -> Say | Refuse:
    mode = s.config.get("train_mode", "full")
    if s.config.get("zero_stage"):
        # DeepSpeed casts the model to 16-bit at initialize and keeps fp32 masters, as measured
        if value not in ("bf16", "fp16"):
            return Refuse(
                "ZeRO runs a 16-bit model with fp32 master weights (precision bf16 or fp16); "
                "autofit measured no other precision with zero_stage >= 1"
            )
        return say(**LLAMAFACTORY_FLAGS[value])
    adapters = mode not in ("full", "freeze")
    if adapters and value in BF16_WEIGHTS:
        return Refuse(
            "PEFT keeps LoRA adapters on a 16-bit model in fp32 under LLaMA-Factory "
            "(get_peft_model's autocast_adapter_dtype), where the measured run kept them in bf16"
        )
    if value == "fp32" and mode in FOUR_BIT_MODES:
        return Refuse(
            "LLaMA-Factory computes a 4-bit base in bf16 when neither bf16 nor fp16 is set "
            "(infer_optim_dtype), where the measured run computed it in fp32"
        )
    # The weights LLaMA-Factory leaves in their published dtype: the frozen ones, or all of them
    # under pure_bf16; a full fine-tune's are otherwise all cast to fp32, as measured.
    if mode != "full" or value in BF16_WEIGHTS:
        kept = TORCH_DTYPES[value]
        published = s.preset.trainers.get("llamafactory", {}).get("torch_dtype")
        which = "its weights" if mode == "full" else "the frozen weights"
        if published is None:
            return Refuse(
                f"LLaMA-Factory keeps {which} in the dtype of the published checkpoint "
                f"(torch_dtype auto), which autofit does not know for {s.model} (its preset's "
                "trainers.llamafactory.torch_dtype)"
            )
        if published != kept:
            return Refuse(
                f"LLaMA-Factory keeps {which} of {s.model} in its published {published} "
                f"(model/loader.py loads with torch_dtype auto), where the measured run kept "
                f"them in {kept}"
            )
    return say(**LLAMAFACTORY_FLAGS[value])
