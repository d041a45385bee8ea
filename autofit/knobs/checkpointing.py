"""checkpointing: keep only each block's input in forward and recompute the block's activations
during backward, trading about one extra forward pass for activation memory."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autofit.families import onetrainer_part
from autofit.knobs.base import Knob, Refuse, Say, Subject, say

if TYPE_CHECKING:
    from autofit.run_state import RunState


def _trl(value: Any, s: Subject) -> Say:
    """SFTConfig checkpoints by default, so off is said too; non-reentrant, as measured (the
    Trainer's activation_checkpointing, transformers 5.24's name for gradient_checkpointing; TRL
    forces the reentrant kind for adapters under ZeRO-3, which keeps the same block inputs)."""
    if not value:
        return say(activation_checkpointing=False)
    warning = ""
    if s.config.get("zero_stage") == 3 and s.config.get("train_mode", "full") != "full":
        warning = (
            "TRL checkpoints PEFT models under ZeRO-3 with use_reentrant=True (the same block "
            "inputs kept; backward recomputes each block from them as measured)"
        )
    return Say(
        settings={
            "activation_checkpointing": True,
            "activation_checkpointing_kwargs": {"use_reentrant": False},
        },
        warning=warning,
    )


def _axolotl(value: Any, s: Subject) -> Say:
    """Said when off too; non-reentrant as measured, said outright: axolotl's normalize_config
    makes it reentrant when no kwargs are given (utils/config/__init__.py, 0.19)."""
    if not value:
        return say(gradient_checkpointing=False)
    return say(gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False})


def _torchtune(value: Any, s: Subject) -> Say:
    """torchtune 0.6.1's enable_activation_checkpointing wraps every TransformerSelfAttentionLayer
    in a non-reentrant checkpoint (training/activations.py). Every N-th layer is its ac_mode
    selective instead, which runs only with enable_activation_checkpointing off
    (checkpoint_interval's words)."""
    every_layer = bool(value) and s.config.get("checkpoint_interval", 1) == 1
    return say(enable_activation_checkpointing=every_layer)


def _litgpt(value: Any, s: Subject) -> Say | Refuse:
    """litgpt 0.5.13 has no setting: it checkpoints every block (non-reentrant) exactly when it
    runs on more than one device, finetune_full through Lightning's FSDPStrategy
    (activation_checkpointing_policy={Block}), finetune_lora in parallelize_fn (checkpoint_wrapper
    on each block); on one device it checkpoints nothing."""
    if bool(value) == (s.world_size > 1):
        return Say()
    return Refuse(
        "LitGPT's finetune scripts checkpoint every block when they run on more than one device "
        "and none on one (finetune/full.py FSDPStrategy, finetune/lora.py parallelize_fn); "
        "it has no setting for it"
    )


def _llamafactory(value: Any, s: Subject) -> Say:
    """LLaMA-Factory 0.9.5 checkpoints by default (model_args.disable_gradient_checkpointing), with
    torch's reentrant checkpoint unless use_reentrant_gc is false (model/model_utils/
    checkpointing.py prepare_model_for_training): non-reentrant as measured, said outright. It
    checkpoints only the layers with trained weights, and makes each one's hidden-state input
    require a gradient."""
    if not value:
        return say(disable_gradient_checkpointing=True)
    return Say(
        settings={"disable_gradient_checkpointing": False, "use_reentrant_gc": False},
        warning="LLaMA-Factory's checkpointing makes the first trained layer's input require a "
        "gradient (checkpointing.py get_custom_gradient_checkpointing_func), adding that input's "
        "gradient (one batch x sequence x hidden tensor) at the end of backward",
    )


class Checkpointing(Knob):
    name = "checkpointing"
    depends_on = ("checkpoint_interval", "train_mode", "world_size", "zero_stage")
    default = False
    help = "recompute each block's activations in backward instead of keeping them"
    kind = bool
    values = {
        True: "gradient checkpointing on every transformer block",
        False: "gradient checkpointing off",
    }
    # Said even when off: training code that checkpoints by default would differ from the probe.
    default_asks_nothing = False
    reach = "pass"  # blocks recompute in backward; weights and update are the same

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        return False if value else None

    def apply(self, run: RunState, value: Any) -> None:
        if value:
            run.workload.enable_checkpointing(run.model, run.checkpoint)

    trainers = {
        "simpletuner": lambda v, s: say(gradient_checkpointing=v),
        "kohya": lambda v, s: say(gradient_checkpointing=v),
        "sana": lambda v, s: say(**{"train.grad_checkpointing": v}),
        "diffusers": {True: say(**{"--gradient_checkpointing": True}), False: Say()},
        "trl": _trl,
        "axolotl": _axolotl,
        "torchtune": _torchtune,
        "litgpt": _litgpt,
        "llamafactory": _llamafactory,
        "musubi": {True: say(**{"--gradient_checkpointing": True}), False: Say()},
        # ai-toolkit checkpoints every block unless told not to (TrainConfig's default is true):
        # said both ways. Its LoRA network's own checkpointing follows the same switch.
        "ai_toolkit": lambda v, s: say(**{"train.gradient_checkpointing": v}),
        # OneTrainer checkpoints each block of a part unless told not to (its default is true):
        # Flux's and Chroma's double and single blocks, the UNet's as diffusers does and its
        # transformer blocks again inside (modules/util/checkpointing_util.py at 23df3832).
        "onetrainer": lambda v, s: say(
            **{f"{onetrainer_part(s.family)}.gradient_checkpointing": v}
        ),
    }
