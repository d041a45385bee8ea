"""optimizer: which update rule runs, and so how many bytes of state each parameter carries.

- `adamw`: torch AdamW, fused; two states like the parameter.
- `adamw8bit`, `paged_adamw8bit`, `lion8bit`, `paged_lion8bit`: bitsandbytes' block-wise 8-bit
  states (one byte per element per state, plus an fp32 scale per 256 elements); the paged ones
  keep large states in CUDA unified memory, paged to the host under pressure.
- `adafactor`: transformers' Adafactor, factored second moments (a row and a column vector per
  matrix), no first moment.
- `came`: CAME, factored second moments and factored confidence, plus a first moment.
- `lion`: Lion, one state like the parameter.
- `adamw_bf16`: bf16 states on bf16 weights, updates rounded stochastically (SimpleTuner's).
- `sgd`: momentum 0.9, one state like the parameter.
- `lorafa`: PEFT's LoRA-FA (`peft.optimizers.create_lorafa_optimizer`, as PEFT's MetaMathQA
  benchmark runs it): it freezes every `lora_A` factor, so an adapter keeps no input for A's
  gradient and A has no gradient or state, and trains the `lora_B` factors with an AdamW whose
  gradient it projects through (A Aᵀ)⁻¹ (`LoraFAOptimizer`): two states like each B. It changes
  what the pass saves, so unlike the other update rules it is a pass of its own. For
  `train_mode=peft` with a LoRA config (PEFT's function reads the PeftModel's adapters).

Each value is built here as the trainer builds it under that name; on fake tensors the
bitsandbytes optimizers are their memory layout (autofit/emulations/bnb_layout.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autofit.families import diffusers_script
from autofit.knobs.base import Knob, ProbeContext, Refuse, Say, Subject, say
from autofit.knobs.optimizer import language_models
from autofit.knobs.optimizer.shared import LORAFA_IN_CODE
from autofit.knobs.optimizer_impl import ARGUMENTS, adamw_arguments
from autofit.knobs.peft_config import PEFT_MODE, read_fields
from autofit.knobs.precision import BF16_WEIGHTS
from autofit.techniques.optimizers import LEARNING_RATE

if TYPE_CHECKING:
    from autofit.run_state import RunState

Build = Callable[[list[Any], "RunState"], Any]


def _adamw(params: list[Any], run: RunState) -> Any:
    import torch

    # In the implementation optimizer_impl names (fused: one kernel for all parameters and no
    # temporaries), on CUDA and on the CPU alike.
    implementation = ARGUMENTS[run.knobs["optimizer_impl"]]
    return torch.optim.AdamW(params, lr=LEARNING_RATE, weight_decay=0.01, **implementation)


def _sgd(params: list[Any], run: RunState) -> Any:
    import torch

    return torch.optim.SGD(params, lr=LEARNING_RATE, momentum=0.9, foreach=True)


def _adafactor(params: list[Any], run: RunState) -> Any:
    from transformers.optimization import Adafactor

    # The settings kohya's and SimpleTuner's guides give for fine-tuning with Adafactor.
    return Adafactor(
        params, lr=LEARNING_RATE, relative_step=False, scale_parameter=False, warmup_init=False
    )


def _came(params: list[Any], run: RunState) -> Any:
    from came_pytorch import CAME

    return CAME(params, lr=LEARNING_RATE, weight_decay=0.01)


def _lion(params: list[Any], run: RunState) -> Any:
    from lion_pytorch import Lion

    return Lion(params, lr=LEARNING_RATE, weight_decay=0.01)


def _adamw_bf16(params: list[Any], run: RunState) -> Any:
    # lazy: the knobs load without torch (docs/contributing.md)
    from autofit.techniques.optimizers.adamw_bf16 import AdamWBF16

    return AdamWBF16(params, lr=LEARNING_RATE)


def _lorafa(params: list[Any], run: RunState) -> Any:
    from peft.optimizers import create_lorafa_optimizer

    config = run.model.peft_config["default"]
    return create_lorafa_optimizer(run.model, config.r, config.lora_alpha, lr=LEARNING_RATE)


def _bnb(name: str, states: int, paged: bool) -> Build:
    def build(params: list[Any], run: RunState) -> Any:
        if run.fake:
            # lazy: the knobs load without torch (docs/contributing.md)
            from autofit.emulations.bnb_layout import Blockwise8bitLayout

            return Blockwise8bitLayout(
                params, states=states, lr=LEARNING_RATE, paged=paged, host=run.host
            )
        import bitsandbytes as bnb

        return getattr(bnb.optim, name)(params, lr=LEARNING_RATE)

    return build


@dataclass(frozen=True)
class UpdateRule:
    """One value of the knob: how autofit builds it, and what one's own code builds for it."""

    build: Build
    code: str
    libraries: tuple[str, ...] = ()  # what `build` imports, on some backend (Knob.libraries)


RULES = {
    "adamw": UpdateRule(_adamw, "torch.optim.AdamW"),
    "adamw8bit": UpdateRule(_bnb("AdamW8bit", states=2, paged=False), "bitsandbytes.optim.AdamW8bit", ("bitsandbytes",)),
    "paged_adamw8bit": UpdateRule(_bnb("PagedAdamW8bit", states=2, paged=True), "bitsandbytes.optim.PagedAdamW8bit", ("bitsandbytes",)),
    "adafactor": UpdateRule(_adafactor, "transformers.optimization.Adafactor(relative_step=False, scale_parameter=False, warmup_init=False)", ("transformers",)),
    "came": UpdateRule(_came, "came_pytorch.CAME", ("came_pytorch",)),
    "lion": UpdateRule(_lion, "lion_pytorch.Lion", ("lion_pytorch",)),
    "lion8bit": UpdateRule(_bnb("Lion8bit", states=1, paged=False), "bitsandbytes.optim.Lion8bit", ("bitsandbytes",)),
    "paged_lion8bit": UpdateRule(_bnb("PagedLion8bit", states=1, paged=True), "bitsandbytes.optim.PagedLion8bit", ("bitsandbytes",)),
    "adamw_bf16": UpdateRule(_adamw_bf16, "an AdamW keeping bf16 states with stochastic rounding (SimpleTuner's adamw_bf16)"),
    "sgd": UpdateRule(_sgd, "torch.optim.SGD(momentum=0.9)"),
    "lorafa": UpdateRule(_lorafa, "peft.optimizers.create_lorafa_optimizer(model, r, lora_alpha, lr) (LoRA-FA: lora_A frozen)", ("peft",)),
}  # fmt: skip
# The update rules that change what the pass saves (LoRA-FA freezes the A factors).
PASS_CHANGING = ("lorafa",)


# The bitsandbytes optimizers whose state lives in CUDA unified memory.
PAGED = ("paged_adamw8bit", "paged_lion8bit")


def build_optimizer(name: str, params: list[Any], run: RunState) -> Any:
    return RULES[name].build(params, run)


def _device_optimizer(name: str, run: RunState) -> Any:
    """The update of the GPU-resident parameters: one step after backward, or fused into it
    (the fused_backward knob), per parameter or per transformer block."""
    params = run.device_trainable_parameters()
    fused = run.knobs["fused_backward"]
    if fused == "off":
        return build_optimizer(name, params, run)
    # lazy: the knobs load without torch (docs/contributing.md)
    from autofit.techniques.optimizers.in_backward import InBackwardOptimizer

    groups: list[list[Any]] = []
    if fused == "block":
        trained, grouped = set(params), set()
        for path in run.preset.blocks:
            for block in run.model.get_submodule(path):
                group = [p for p in block.parameters() if p in trained]
                if group:
                    groups.append(group)
                    grouped.update(group)
        params = [p for p in params if p not in grouped]
    groups += [[p] for p in params]
    return InBackwardOptimizer(groups, lambda group: build_optimizer(name, group, run))


# -- trainers ---------------------------------------------------------------------------------

# SimpleTuner's name, and the --optimizer_config that makes it the optimizer the probe ran
# (torch's SGD has no momentum by default; optimi's Lion adds a Kahan-summation buffer; SDNQ's
# CAME quantizes its buffers unless told not to).
SIMPLETUNER = {
    "adamw": ("torch-adamw", None),  # its implementation: optimizer_impl's words
    "adamw8bit": ("bnb-adamw8bit", None),
    "paged_adamw8bit": ("bnb-adamw8bit-paged", None),
    "adafactor": ("torch-adafactor", None),
    "came": ("sdnq-came", "use_quantized_buffers=false,use_stochastic_buffers=false"),
    "lion": ("optimi-lion", "kahan_sum=false"),
    "lion8bit": ("bnb-lion8bit", None),
    "paged_lion8bit": ("bnb-lion8bit-paged", None),
    "adamw_bf16": ("adamw_bf16", None),
    "sgd": ("torch-sgd", "momentum=0.9"),
}
# sd-scripts' optimizer_type and optimizer_args (a dotted name is imported as module.Class; a
# bare unknown name comes from torch.optim).
KOHYA = {
    "adamw": ("AdamW", []),  # its implementation: optimizer_impl's words
    "adamw8bit": ("AdamW8bit", []),
    "paged_adamw8bit": ("PagedAdamW8bit", []),
    "adafactor": (
        "Adafactor",
        ["relative_step=False", "scale_parameter=False", "warmup_init=False"],
    ),
    "came": ("came_pytorch.CAME", ["weight_decay=0.01"]),
    "lion": ("Lion", ["weight_decay=0.01"]),
    "lion8bit": ("Lion8bit", []),
    "paged_lion8bit": ("PagedLion8bit", []),
    "adamw_bf16": ("AdamW", ["fused=True"]),
    "sgd": ("SGD", ["momentum=0.9"]),
}
# musubi-tuner's --optimizer_type and --optimizer_args (training/trainer_base.py get_optimizer:
# AdamW, AdamW8bit and AdaFactor by name, any other as a class of torch.optim or a dotted path).
MUSUBI = {
    "adamw": ("AdamW", []),  # its implementation: optimizer_impl's words
    "adamw8bit": ("AdamW8bit", []),
    "paged_adamw8bit": ("bitsandbytes.optim.PagedAdamW8bit", []),
    "adafactor": (
        "AdaFactor",
        ["relative_step=False", "scale_parameter=False", "warmup_init=False"],
    ),
    "lion8bit": ("bitsandbytes.optim.Lion8bit", []),
    "paged_lion8bit": ("bitsandbytes.optim.PagedLion8bit", []),
    "sgd": ("SGD", ["momentum=0.9"]),
}
# Sana's optimizer `type` (an mmcv registry name: torch.optim's classes and Sana's wrappers in
# diffusion/utils/optimizer.py) and the settings that make it the optimizer the probe ran.
SANA: dict[str, dict[str, Any]] = {
    "adamw": {"type": "AdamW", "lr": 1e-4, "weight_decay": 0.01},  # + optimizer_impl's words
    "adamw8bit": {"type": "AdamW8bitWrapper", "lr": 1e-4, "weight_decay": 0.01},
    "adafactor": {"type": "Adafactor", "lr": 1e-4, "weight_decay": 0.0},
    "came": {"type": "CAMEWrapper", "lr": 1e-4, "weight_decay": 0.01},
    "lion": {"type": "Lion", "lr": 1e-4, "weight_decay": 0.01},
    "sgd": {"type": "SGD", "lr": 1e-4, "momentum": 0.9},
}


# ai-toolkit's train.optimizer names (toolkit/optimizer.py get_optimizer at 27a03a91): torch's
# AdamW (its implementation: optimizer_impl's words), bitsandbytes' AdamW8bit and Lion8bit, its
# own copy of transformers' Adafactor (relative_step, scale_parameter and warmup_init off unless
# told) and lion_pytorch's Lion; optimizer_params go to the optimizer as they are.
AI_TOOLKIT = {
    "adamw": ("adamw", None),
    "adamw8bit": ("adamw8bit", None),
    "adafactor": ("adafactor", None),
    "lion": ("lion", {"weight_decay": 0.01}),
    "lion8bit": ("lion8bit", None),
}


def _ai_toolkit(value: Any, s: Subject) -> Say | Refuse:
    if value not in AI_TOOLKIT:
        why = {"lorafa": LORAFA_IN_CODE, "sgd": "its optimizers have no SGD"}
        return Refuse(
            f"ai-toolkit has no {value}: {why.get(value, 'toolkit/optimizer.py does not name it')}"
        )
    name, params = AI_TOOLKIT[value]
    return say(
        **{"train.optimizer": name}, **({"train.optimizer_params": params} if params else {})
    )


# OneTrainer's optimizer sub-config (modules/util/create.py create_optimizer at 23df3832): torch's
# AdamW (its implementation: optimizer_impl's words) without the stochastic rounding its own step
# adds by default (which allows neither fused nor foreach); bitsandbytes' AdamW8bit and Lion8bit
# (is_paged: the paged ones); transformers' Adafactor, which it steps with its own copy of the
# update (optimizer/adafactor_extensions.py, one parameter at a time as transformers'); lion_pytorch's
# Lion; torch's SGD. The values autofit measured where OneTrainer's default differs.
ONETRAINER: dict[str, dict[str, Any]] = {
    "adamw": {"optimizer": "ADAMW", "stochastic_rounding": False, "weight_decay": 0.01},
    "adamw8bit": {"optimizer": "ADAMW_8BIT", "is_paged": False},
    "paged_adamw8bit": {"optimizer": "ADAMW_8BIT", "is_paged": True},
    "adafactor": {"optimizer": "ADAFACTOR", "relative_step": False, "scale_parameter": False,
                  "warmup_init": False, "stochastic_rounding": False},
    "lion": {"optimizer": "LION", "weight_decay": 0.01},
    "lion8bit": {"optimizer": "LION_8BIT", "is_paged": False},
    "paged_lion8bit": {"optimizer": "LION_8BIT", "is_paged": True},
    "sgd": {"optimizer": "SGD", "momentum": 0.9, "foreach": True},
}  # fmt: skip


def _onetrainer(value: Any, s: Subject) -> Say | Refuse:
    if value not in ONETRAINER:
        why = {
            "came": "its CAME is its own (modules/util/optimizer/CAME.py), which autofit has not "
            "matched against came_pytorch's it measured",
            "adamw_bf16": "its AdamW's stochastic rounding is its own step "
            "(optimizer/adamw_extensions.py), which autofit has not matched against "
            "SimpleTuner's adamw_bf16",
            "lorafa": LORAFA_IN_CODE,
        }
        return Refuse(f"OneTrainer has no {value}: {why[value]}")
    return say(**{f"optimizer.{key}": v for key, v in ONETRAINER[value].items()})


def _simpletuner(value: Any, s: Subject) -> Say | Refuse:
    if value not in SIMPLETUNER:
        return Refuse(f"SimpleTuner has no {value}: {LORAFA_IN_CODE}")
    name, options = SIMPLETUNER[value]
    return say(optimizer=name, **({"optimizer_config": options} if options else {}))


def _kohya(value: Any, s: Subject) -> Say | Refuse:
    if value not in KOHYA:
        return Refuse(f"sd-scripts has no {value}: {LORAFA_IN_CODE}")
    name, options = KOHYA[value]
    settings: dict[str, Any] = {"optimizer_type": name}
    if options:
        settings["optimizer_args"] = options
    if value != "adamw_bf16":
        return Say(settings=settings)
    return Say(
        settings=settings,
        warning="sd-scripts has no stochastic-rounding AdamW; AdamW under full_bf16 keeps the "
        "same bf16 states (the same memory) but rounds its updates to nearest",
    )


def _musubi(value: Any, s: Subject) -> Say | Refuse:
    if value not in MUSUBI:
        why = {
            "adamw_bf16": "its stochastic-rounding AdamW keeps bf16 weights; musubi-tuner's LoRA "
            "weights are fp32",
            "lorafa": LORAFA_IN_CODE,
        }
        return Refuse(
            f"musubi-tuner has no {value}: {why.get(value, 'autofit has not matched it')}"
        )
    name, options = MUSUBI[value]
    settings: dict[str, Any] = {"--optimizer_type": name}
    if options:
        settings["--optimizer_args"] = options
    return Say(settings=settings)


def _sana(value: Any, s: Subject) -> Say | Refuse:
    if value in SANA:
        return say(**{"train.optimizer": SANA[value]})
    return Refuse(f"Sana's optimizer registry has no {value}")


def _diffusers(value: Any, s: Subject) -> Say | Refuse:
    if value not in ("adamw", "adamw8bit"):
        return Refuse(
            "the diffusers example scripts offer AdamW, 8-bit AdamW (--use_8bit_adam) and Prodigy"
        )
    script = diffusers_script(s.family, s.config["train_mode"])
    settings: dict[str, Any] = {}
    if script is not None and script.kind == "dreambooth":
        settings["--optimizer"] = "AdamW"
    if value == "adamw8bit":
        return Say(settings={**settings, "--use_8bit_adam": True})
    return Say(settings=settings)  # the AdamW implementation: optimizer_impl's words


def _deepspeed(value: Any, s: Subject) -> Say | Refuse | None:
    """An optimizer in the config only where DeepSpeed must build it itself: ZeRO-Offload steps
    on the CPU with DeepSpeed's CPU Adam. Otherwise the training code passes its own."""
    if s.config["offload_optimizer"] != "cpu":
        return None
    if value != "adamw":
        return Refuse(
            "ZeRO-Offload runs DeepSpeed's CPU AdamW; autofit measured offload only with optimizer=adamw"
        )
    return say(
        note="optimizer=adamw: DeepSpeed builds its CPU AdamW from the config (ZeRO-Offload); "
        "pass no optimizer of your own",
        optimizer={"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
    )


def _lorafa_reason(context: ProbeContext) -> str | None:
    knobs = context.knobs
    mode = knobs.get("train_mode", "full")
    if mode != PEFT_MODE or not knobs.get("peft_config"):
        return f"optimizer=lorafa is PEFT's LoRA-FA over a PeftModel's LoRA adapters: it needs train_mode=peft with a LoRA peft_config; train_mode={mode}"
    if read_fields(knobs["peft_config"]).get("peft_type") != "LORA":
        return "optimizer=lorafa trains the B factors of LoRA adapters: peft_config must be a LoRA config (peft_type LORA)"
    for knob, plain in (
        ("fused_backward", "off"),
        ("zero_stage", 0),
        ("fsdp", "off"),
        ("offload_optimizer", "none"),
    ):
        if knobs.get(knob, plain) != plain:
            return f"optimizer=lorafa with {knob}={knobs[knob]}: its update pairs each adapter's A and B across the model, which autofit has not modelled there"
    return None


class Optimizer(Knob):
    name = "optimizer"
    depends_on = (
        "fsdp",
        "fused_backward",
        "offload_optimizer",
        "optimizer_impl",
        "peft_config",
        "precision",
        "train_mode",
        "zero_stage",
    )
    default = "adamw"
    help = "the update rule, which sets the optimizer state per parameter"
    values = {name: rule.code for name, rule in RULES.items()}
    default_asks_nothing = False  # trainers' default optimizers differ
    per_sample_memory = False  # optimizer state is per parameter, not per sample
    reach = "outside_pass"  # the update reads the gradients the pass leaves
    reads = ("host_parameters", "host_gradients")
    writes = ("optimizer",)
    after = ("train_mode",)  # it updates the parameters that train

    def libraries(self, value: Any) -> tuple[str, ...]:
        return RULES[value].libraries

    def means(self, value: Any, subject: Subject) -> str:
        if value == "adamw":
            return f"torch.optim.AdamW({adamw_arguments(subject.config.get('optimizer_impl', 'fused'))})"
        return super().means(value, subject)

    def changes_pass_between(self, one: Any, other: Any) -> bool:
        return one in PASS_CHANGING or other in PASS_CHANGING

    def invalid_reason(self, value: Any, context: ProbeContext) -> str | None:
        if value == "lorafa":
            return _lorafa_reason(context)
        if value in PAGED and context.backend == "cpu":
            return f"optimizer={value} pages its state through CUDA unified memory: it needs the cuda or simulate backend"
        if value == "adamw_bf16" and context.knobs.get("precision") not in BF16_WEIGHTS:
            return "optimizer=adamw_bf16 trains bf16 weights: it needs precision=bf16_pure or bf16_autocast"
        return None

    def apply(self, run: RunState, value: Any) -> None:
        on_device = _device_optimizer(value, run)
        if not run.host_parameters:
            run.optimizer = on_device
            return
        # lazy: the knobs load without torch (docs/contributing.md)
        from autofit.techniques.optimizers.split import HostSplitOptimizer

        run.optimizer = HostSplitOptimizer(
            on_device, build_optimizer(value, run.host_parameters, run), run
        )

    trainers = {
        "deepspeed": _deepspeed,
        "simpletuner": _simpletuner,
        "kohya": _kohya,
        "sana": _sana,
        "diffusers": _diffusers,
        "trl": language_models.trl,
        "musubi": _musubi,
        "axolotl": language_models.axolotl,
        "ai_toolkit": _ai_toolkit,
        "torchtune": language_models.torchtune,
        "litgpt": language_models.litgpt,
        # LLaMA-Factory's optim is transformers' TrainingArguments field (train/sft/trainer.py
        # builds the Trainer's own optimizer unless GaLore, APOLLO, BAdam, Adam-mini or Muon asks)
        "llamafactory": language_models.trl,
        "onetrainer": _onetrainer,
    }
