"""optimizer_impl: how torch's AdamW runs its step (optimizer=adamw only).

- `fused`: one kernel over every parameter, no temporaries (what autofit measured before this knob
  existed, and torchtune's configs ask for).
- `foreach`: torch's default on a GPU when nothing is asked (the HF Trainer's `adamw_torch`, the
  diffusers and LitGPT scripts): grouped kernels whose step holds about one parameter-sized
  temporary (the square roots of the second moments) at its peak.
- `for_loop`: one parameter at a time (`foreach=False`): small temporaries, slowest.

The simulator runs torch's own AdamW in the chosen implementation, so the temporaries are counted
as they are allocated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.models import ModelPreset

# torch.optim.AdamW's arguments for each implementation.
ARGUMENTS = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for_loop": {"foreach": False}}
DEFAULT_ON_A_GPU = "foreach"  # what AdamW picks when told nothing


def adamw_arguments(value: str) -> str:
    return ", ".join(f"{k}={v}" for k, v in ARGUMENTS[value].items())


def _words(value: str, form: str) -> list[str]:
    """AdamW's arguments for an implementation as `key=value` words (`lv`: the value lowercase)."""
    return [form.format(k=k, v=v, lv=str(v).lower()) for k, v in ARGUMENTS[value].items()]


def _by_default(written: Any) -> Any:
    """Words for a trainer that builds torch's AdamW told nothing (foreach on a GPU) unless its
    config passes the implementation: `written(value)` are those settings."""

    def express(value: Any, s: Subject) -> Say:
        return Say() if value == DEFAULT_ON_A_GPU else Say(settings=written(value))

    return express


def _diffusers(value: Any, s: Subject) -> Say | Refuse:
    """The example scripts build torch.optim.AdamW told nothing: foreach on a GPU."""
    if value == DEFAULT_ON_A_GPU:
        return Say()
    why = (
        "the diffusers example scripts build torch.optim.AdamW with its default implementation "
        "(foreach on a GPU), whose step holds a temporary the size of the trained weights"
    )
    if value == "fused" and s.config["train_mode"] != "full":
        # a LoRA's trained weights are small: the temporary is too
        return Say(warning=f"{why}; for LoRA adapters that is a few MiB more than measured")
    return Refuse(why)


# transformers' `optim` names AdamW fused or foreach, nothing else (TRL and LLaMA-Factory pass it on).
TRANSFORMERS_ADAMW = {
    "fused": Say(),
    "foreach": Say(),
    "for_loop": Refuse(
        "transformers' AdamW names build it fused (adamw_torch_fused) or with torch's "
        "default (adamw_torch: foreach on a GPU)"
    ),
}


class OptimizerImpl(Knob):
    name = "optimizer_impl"
    depends_on = ("optimizer", "train_mode", "zero_stage")
    decided_by_trainer = True
    default = "fused"
    help = (
        "how AdamW steps (optimizer=adamw): fused | foreach (torch's default on a GPU) | for_loop"
    )
    values = {
        "fused": "torch.optim.AdamW(fused=True)",
        "foreach": "torch.optim.AdamW(foreach=True), torch's default on a GPU",
        "for_loop": "torch.optim.AdamW(foreach=False)",
    }
    per_sample_memory = False
    reach = "outside_pass"  # how the update steps

    def applies(self, config: Mapping[str, Any], preset: ModelPreset) -> bool:
        return config.get("optimizer") == "adamw"

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value == self.default:
            return None
        if context.knobs.get("optimizer") != "adamw":
            return f"optimizer_impl={value} applies to optimizer=adamw only"
        if context.knobs.get("zero_stage"):
            return f"optimizer_impl={value}: ZeRO steps with DeepSpeed's own fused Adam"
        return None

    # The optimizer knob builds AdamW with ARGUMENTS[value]; for one's own code its note names them.
    trainers = {
        "accelerate": lambda v, s: Say(),
        "deepspeed": lambda v, s: Say(),
        "kohya": _by_default(lambda v: {"optimizer_args": _words(v, "{k}={v}")}),
        "simpletuner": _by_default(lambda v: {"optimizer_config": ",".join(_words(v, "{k}={lv}"))}),
        "sana": _by_default(lambda v: {f"train.optimizer.{k}": x for k, x in ARGUMENTS[v].items()}),
        "diffusers": _diffusers,
        # The optimizer's words name transformers' adamw_torch_fused or adamw_torch (foreach).
        # torchtune instantiates torch.optim.AdamW with every key of its optimizer section
        "torchtune": lambda v, s: Say(
            settings={f"optimizer.{k}": x for k, x in ARGUMENTS[v].items()}
        ),
        "axolotl": {
            "fused": Say(),
            "foreach": Say(),
            "for_loop": Refuse(
                "axolotl's AdamW names are transformers' (adamw_torch_fused, adamw_torch: "
                "foreach on a GPU)"
            ),
        },
        # LitGPT passes optimizer.init_args to torch.optim.AdamW (the optimizer's class_path)
        "litgpt": _by_default(
            lambda v: {f"optimizer.init_args.{k}": x for k, x in ARGUMENTS[v].items()}
        ),
        "trl": TRANSFORMERS_ADAMW,
        # LLaMA-Factory's optim is transformers' own (the optimizer's words name it)
        "llamafactory": TRANSFORMERS_ADAMW,
        # musubi-tuner builds torch.optim.AdamW with its --optimizer_args
        "musubi": _by_default(lambda v: {"--optimizer_args": _words(v, "{k}={v}")}),
        # ai-toolkit builds torch.optim.AdamW with its train.optimizer_params as they are
        "ai_toolkit": _by_default(lambda v: {"train.optimizer_params": dict(ARGUMENTS[v])}),
        # OneTrainer builds torch's AdamW one parameter at a time unless told (its foreach and
        # fused default to false, modules/util/config/TrainConfig.py at 23df3832): said both ways
        "onetrainer": lambda v, s: say(
            **{"optimizer.fused": v == "fused", "optimizer.foreach": v == "foreach"}
        ),
    }
