"""fused_backward: the optimizer step fused into the backward pass.

- `off`: backward makes every gradient, then one optimizer step updates every parameter.
- `parameter`: each parameter is updated as soon as its gradient is complete, and the gradient
  freed (kohya's `fused_backward_pass`, torchtune's `optimizer_in_bwd`, OneTrainer's fused back
  pass): at most a parameter's gradient waits, never the model's.
- `block`: each transformer block's parameters are updated together once the block's backward is
  done (kohya's `blockwise_fused_optimizers`): a block's gradients wait, not one parameter's.

The optimizer knob builds the update rule this way (autofit/techniques/optimizers/in_backward.py). Its rules:
no gradient accumulation (a gradient freed inside backward cannot be summed over micro-batches:
exports refuse a run that needs it), no fp16 loss scaling (the scaler checks every gradient for
overflow before any update), and not under DeepSpeed ZeRO (which drives the update itself).
Swapped blocks keep their update on the host, after backward, as without it.
"""

from __future__ import annotations

from typing import Any

from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say

NOT_FUSED = "fused_backward=off"


def _accumulation(value: Any, s: Subject) -> Refuse | None:
    if value != "off" and s.accumulation > 1:
        return Refuse(
            f"fused_backward={value} frees each gradient inside backward, so the {s.accumulation} "
            "micro-batches of gradient accumulation cannot be summed",
            NOT_FUSED,
        )
    return None


def _kohya(value: Any, s: Subject) -> Say | Refuse:
    if value == "off":
        return Say()
    refused = _accumulation(value, s)
    if refused:
        return refused
    if s.config["train_mode"] != "full":
        return Refuse(
            "sd-scripts fuses the optimizer step only in its full fine-tune scripts", NOT_FUSED
        )
    if value == "parameter":
        if s.config["optimizer"] != "adafactor":
            return Refuse(
                "sd-scripts' fused_backward_pass supports only Adafactor; for other optimizers it "
                "offers blockwise_fused_optimizers",
                "fused_backward=off, block; parameter with optimizer=adafactor",
            )
        return say(fused_backward_pass=True)
    return say(blockwise_fused_optimizers=True)


def _simpletuner(value: Any, s: Subject) -> Say | Refuse:
    """SimpleTuner's optimizer_release_gradients: optimi's gradient release, which steps each
    parameter from its gradient hook, for optimi's optimizers only."""
    if value == "off":
        return Say()
    refused = _accumulation(value, s)
    if refused:
        return refused
    if value == "block":
        return Refuse(
            "SimpleTuner releases gradients per parameter (optimizer_release_gradients), not per block",
            "fused_backward=off, parameter",
        )
    if (
        s.config["optimizer"] != "lion"
    ):  # SimpleTuner's optimi-lion; its other optimizers are not optimi's
        return Refuse(
            "SimpleTuner's optimizer_release_gradients works with optimi's optimizers only "
            "(optimi-lion: optimizer=lion)",
            "fused_backward=off; parameter with optimizer=lion",
        )
    return say(optimizer_release_gradients=True)


def _torchtune(value: Any, s: Subject) -> Say | Refuse:
    """torchtune 0.6.1's optimizer_in_bwd, read by its full fine-tune recipes (which require the
    key): one optimizer per parameter, stepped from its post-accumulate-grad hook, the gradient
    then set to None (training/memory.py register_optim_in_bwd_hooks)."""
    full = s.config.get("train_mode", "full") == "full"
    if value == "off":
        return say(optimizer_in_bwd=False) if full else Say()
    refused = _accumulation(value, s)
    if refused:
        return refused
    if not full:
        return Refuse(
            "torchtune's LoRA recipes step after backward (no optimizer_in_bwd)", NOT_FUSED
        )
    if value == "block":
        return Refuse(
            "torchtune's optimizer_in_bwd steps each parameter on its own, not each block",
            "fused_backward=off, parameter",
        )
    return say(optimizer_in_bwd=True)


def _onetrainer(value: Any, s: Subject) -> Say | Refuse:
    """OneTrainer's fused_back_pass (modules/trainer/GenericTrainer.py at 23df3832): a
    post-accumulate-grad hook per trained parameter steps it (clipping its gradient alone) and
    sets the gradient to None, for the optimizers supports_fused_back_pass names; its AdamW only
    one parameter at a time (neither fused nor foreach, modules/util/create.py)."""
    if value == "off":
        return say(**{"optimizer.fused_back_pass": False})
    refused = _accumulation(value, s)
    if refused:
        return refused
    if value == "block":
        return Refuse(
            "OneTrainer's fused_back_pass steps each parameter on its own, not each block",
            "fused_backward=off, parameter",
        )
    optimizer = s.config["optimizer"]
    if optimizer not in ("adamw", "adafactor"):
        return Refuse(
            f"OneTrainer's fused_back_pass has no {optimizer} of autofit's (its AdamW, Adafactor, "
            "CAME and own *_ADV optimizers)",
            "fused_backward=off; parameter with optimizer=adamw or adafactor",
        )
    if optimizer == "adamw" and s.config["optimizer_impl"] != "for_loop":
        return Refuse(
            "OneTrainer fuses AdamW's step into backward one parameter at a time, neither fused "
            "nor foreach",
            "fused_backward=off; parameter with optimizer_impl=for_loop",
        )
    return say(**{"optimizer.fused_back_pass": True})


def _own_code(value: Any, s: Subject) -> Say | Refuse | None:
    """Targets that configure one's own code: the note of what it must do, unless it cannot."""
    return _accumulation(value, s)


class FusedBackward(Knob):
    name = "fused_backward"
    depends_on = ("optimizer", "optimizer_impl", "precision", "train_mode", "zero_stage")
    default = "off"
    help = (
        "the optimizer step inside backward: off | parameter (each gradient freed at once) | block"
    )
    values = {
        "off": "all gradients first, then one optimizer step",
        "parameter": "step each parameter from a post-accumulate-grad hook as soon as its gradient "
        "is complete, then free the gradient (no gradient accumulation)",
        "block": "step each transformer block's parameters once the block's backward is done, "
        "then free its gradients (no gradient accumulation)",
    }
    per_sample_memory = False  # gradients are per parameter, not per sample
    # The optimizer knob's apply reads it (it builds the update rule this way).

    def saves_memory_over(self, value: Any, searched: tuple[Any, ...] = ()) -> Any:
        # Many small updates instead of one fused kernel: never faster than the unfused step.
        if value == "parameter":
            return "block" if "block" in searched else "off"
        return "off" if value == "block" else None

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value == "off":
            return None
        knobs = context.knobs
        if knobs.get("zero_stage"):
            return f"fused_backward={value}: DeepSpeed ZeRO drives backward and the update itself; use zero_stage=0"
        if knobs.get("precision") == "fp16":
            return f"fused_backward={value}: fp16's loss scaler checks every gradient before any update; use precision=bf16"
        if value == "block" and not context.model.blocks:
            return f"fused_backward=block groups by transformer block, which {context.model.name} does not list; use parameter"
        return None

    trainers = {
        "kohya": _kohya,
        "torchtune": _torchtune,
        "accelerate": _own_code,
        "deepspeed": _own_code,
        "simpletuner": _simpletuner,
        "sana": {
            "off": Say(),
            **dict.fromkeys(
                ("parameter", "block"), Refuse("Sana's train.py steps after backward", NOT_FUSED)
            ),
        },
        "diffusers": {
            "off": Say(),
            **dict.fromkeys(
                ("parameter", "block"),
                Refuse("the diffusers example scripts step after backward", NOT_FUSED),
            ),
        },
        "onetrainer": _onetrainer,
    }
