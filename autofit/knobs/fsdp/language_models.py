"""fsdp's words in the language-model trainers' configs (torchtune, LitGPT, axolotl, LLaMA-Factory):
how each shards, and where its FSDP holds other memory than the FSDP2 autofit measures, whose
groups are accelerate 1.15's (autofit/emulations/fsdp_groups.py): each block, an untied input
embedding, the tail (final norm and output head, never resharded after forward, freed once its
backward is done) and the root. The knob itself, with the other trainers' words, is the package's
__init__. (TRL's words are the accelerate config's: autofit/knobs/fsdp/__init__.py.)"""

from __future__ import annotations

from typing import Any

from autofit.knobs.base import Refuse, Say, Subject, say
from autofit.knobs.fsdp.shared import (
    NOT_FSDP,
    RESHARD_AFTER_FORWARD,
    block_classes,
    ram_efficient,
    untied_embedding,
)


def torchtune(value: Any, s: Subject) -> Say | Refuse:
    """torchtune 0.6.1's distributed recipes always shard with FSDP2 (training/_distributed.py
    shard_model): fully_shard on each layer, on the modules custom_sharded_layers names, then on
    the root, which FSDP2 never reshards after forward, all with fsdp_reshard_after_forward. An
    untied input embedding sharded on its own leaves the final norm and output head (and a tied
    embedding) to the root: the groups accelerate makes, which autofit measures. The model is
    built in its dtype, sharded and gathered as it is (no mixed-precision policy: precision's
    words keep it fp32 or bf16_pure)."""
    if value == "off":
        if s.world_size > 1:
            return Refuse(
                "torchtune's distributed recipes shard with FSDP2 always (no plain data parallel)",
                "fsdp=full_shard, shard_grad_op",
            )
        return Say()
    if s.world_size == 1:
        return Refuse(
            "torchtune shards across the processes of its distributed recipes; one GPU runs its "
            "single-device recipes, unsharded",
            NOT_FSDP,
        )
    return say(
        fsdp_reshard_after_forward=RESHARD_AFTER_FORWARD[value],
        custom_sharded_layers=["tok_embeddings"] if untied_embedding(s.preset) else [],
    )


TORCHTUNE_FSDP1 = Refuse(
    "torchtune shards with FSDP2's fully_shard (training/_distributed.py shard_model)",
    "fsdp_version=2",
)


def litgpt(value: Any, s: Subject) -> Say | Refuse:
    """litgpt 0.5.13 shards exactly when it runs on more than one device, with no setting of its
    own: finetune_full through Lightning's FSDPStrategy (FSDP1, FULL_SHARD, each Block a unit,
    cpu_offload=False, use_orig_params=True: finetune/full.py, lightning/fabric/strategies/
    fsdp.py), finetune_lora with fully_shard on each block and on the root (parallelize_fn)."""
    if s.world_size == 1:
        return Refuse(
            "LitGPT runs Lightning's single-device strategy on one GPU: it shards nothing"
        )
    if s.config["train_mode"] != "full":
        return Refuse(
            "LitGPT's finetune_lora shards each block and the root alone (parallelize_fn): the "
            "token embedding and output head stay in the root, where the measured FSDP2 gave "
            "them groups of their own"
        )
    if value == "shard_grad_op":
        return Refuse("Lightning's FSDPStrategy in LitGPT's finetune_full shards FULL_SHARD")
    return Say(
        warning="Lightning's FSDPStrategy runs FSDP1 with use_orig_params=True, whose "
        "per-parameter alignment padding autofit's FSDP1 layout leaves out"
    )


# axolotl 0.19.0 and LLaMA-Factory 0.9.5 (through accelerate 1.11.0's fsdp2_prepare_model) shard
# each decoder layer apart and leave the rest to the root: its input is the token ids, which take
# no gradient, so FSDP2 reshards it only once backward is done (torch 2.13 _fsdp_param_group.py
# _register_post_backward_hook; _fsdp_state.py never reshards a root after forward). A tied head
# is what the measured tail holds too (its first module is the embedding, whose input takes no
# gradient either); an untied one is not.
ROOT_HOLDS_THE_HEAD = (
    "leaves the untied output head (and token embedding) to the root, which FSDP2 reshards only "
    "once backward is done: the gathered head stays through every layer's backward (the "
    "embedding too under full_shard), where the measured run's tail freed it after its own"
)
# Whose fsdp2_prepare_model each trainer runs.
AXOLOTL_FSDP2 = "axolotl 0.19's fsdp2_prepare_model (monkeypatch/accelerate/fsdp2.py)"
LLAMAFACTORY_FSDP2 = "accelerate 1.11's fsdp2_prepare_model (LLaMA-Factory 0.9.5 allows no newer)"


def axolotl(value: Any, s: Subject) -> Say | Refuse:
    """axolotl 0.19.0's FSDP2 (`fsdp_version: 2`, `fsdp_config`): its own fsdp2_prepare_model
    replaces accelerate's (loaders/patch_manager.py): fully_shard on the A and B of every LoRA
    layer, on each module of transformer_layer_cls_to_wrap, then on the root, with no cast of the
    weights (precision's words hold what it trains). The HF Trainer builds the plugin from
    fsdp_config (core/builders/base.py; transformers 5.16.1 training_args.py _process_fsdp_args:
    reshard_after_forward, the wrap, cpu_ram_efficient_loading, state_dict_type) and
    utils/trainer.py setup_fsdp_envs the rest (offload_params as FSDP_OFFLOAD_PARAMS: FSDP2's
    pinned CPUOffloadPolicy). A 4-bit base keeps bnb_4bit_quant_storage=bfloat16 (loaders/
    model.py), which its monkeypatch/fsdp2_qlora.py shards; its validation refuses
    cpu_ram_efficient_loading with one, as the measured run loads it whole on every GPU."""
    if untied_embedding(s.preset):
        return Refuse(f"{AXOLOTL_FSDP2} {ROOT_HOLDS_THE_HEAD}", NOT_FSDP)
    block = {
        "reshard_after_forward": RESHARD_AFTER_FORWARD[value],
        "offload_params": s.config["fsdp_offload"] == "cpu",
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "transformer_layer_cls_to_wrap": block_classes(s.preset),
        "state_dict_type": "SHARDED_STATE_DICT",
        "cpu_ram_efficient_loading": ram_efficient(s),
        # gradient_checkpointing checkpoints the layers (checkpointing's words), as measured
        "activation_checkpointing": False,
    }
    warning = ""
    if s.config["train_mode"] != "full":
        warning = (
            f"{AXOLOTL_FSDP2} shards each LoRA layer's A and B in groups of their own: the "
            "adapters (rank x features, kilobytes to megabytes a layer) gather and reduce apart "
            "from their decoder layer's weights"
        )
    return Say(settings={"fsdp_version": 2, "fsdp_config": block}, warning=warning)


AXOLOTL_FSDP1 = Refuse(
    "axolotl's fsdp_config has no backward_prefetch, so transformers 5.16.1 runs its FSDP1 with "
    "NO_PREFETCH (training_args.py _process_fsdp_args), where the measured FSDP1 gathered the "
    "next unit before reducing the current one (BACKWARD_PRE)",
    "fsdp_version=2",
)
# Under mixed precision (bf16, fp16) accelerate 1.11's fsdp2_prepare_model casts the whole model to
# fp32 when its first weight is not (model.to(torch.float32)), after LLaMA-Factory cast only the
# trained weights (model/adapter.py init_adapter, not under pure_bf16).
LLAMAFACTORY_WHOLE_FP32 = (
    "under FSDP2 with mixed precision accelerate 1.11's fsdp2_prepare_model casts the whole model "
    "to fp32 when its first weight is 16-bit, as LLaMA-Factory leaves a frozen token embedding: "
    "the frozen weights are sharded in fp32, where the measured run kept them 16-bit"
)


def llamafactory(value: Any, s: Subject) -> Say | Refuse:
    """LLaMA-Factory 0.9.5 runs FSDP under `accelerate launch` with an accelerate config
    (examples/accelerate/fsdp_config.yaml, fsdp2_config.yaml in its repository): the HF Trainer
    takes the plugin from the environment accelerate launch sets, so the accelerate words of the
    fsdp knobs are its config (FSDP1 as target=accelerate writes it: the Trainer gives a PEFT
    model PEFT's wrap policy itself). A 4-bit base is stored in its compute dtype (model/
    model_utils/quantization.py: bnb_4bit_quant_storage), bf16 as measured."""
    precision, mode = s.config["precision"], s.config["train_mode"]
    if precision == "bf16_autocast":
        return Refuse(
            "under FSDP with mixed precision accelerate upcasts pure_bf16's trained weights to "
            "fp32 (fsdp2_prepare_model; FSDP1: Accelerator.prepare_model), so the run is "
            "precision=bf16, not bf16 weights",
            NOT_FSDP,
        )
    if s.config.get("fsdp_version", 2) == 1:
        return Say()
    if untied_embedding(s.preset):
        return Refuse(f"{LLAMAFACTORY_FSDP2} {ROOT_HOLDS_THE_HEAD}", NOT_FSDP)
    if precision in ("bf16", "fp16") and mode != "full":
        return Refuse(LLAMAFACTORY_WHOLE_FP32, NOT_FSDP)
    return Say()
