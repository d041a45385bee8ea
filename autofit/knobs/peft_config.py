"""peft_config: the PEFT adapter config file that `train_mode=peft` trains.

Any method PEFT has (IA3, LoHa, LoKr, VeRA, BOFT, OFT, prompt and prefix tuning, ...) is given as
PEFT saves its config: an `adapter_config.json`, or the folder holding one. Only `peft_type` is
required; every other field takes PEFT's default, as `PeftConfig` takes it. The probe builds the
adapters with PEFT's own code on the model (`PeftConfig.from_peft_type`, then `get_peft_model`),
so what each method keeps (its extra parameters, the buffers it registers, what its
forward saves for backward, the virtual tokens it prepends) is PEFT's, not a re-implementation.

The file is read when a probe runs, from the path as given (relative to the working directory).
The adapters take the dtype PEFT gives them: `get_peft_model`'s default `autocast_adapter_dtype`
keeps them in fp32 on a 16-bit model, whatever the precision knob trains the model in, and each
adapted layer casts its input to fp32 for them (what a bf16 PEFT run holds that bf16 LoRA does
not); `adapter_dtype=model` passes `autocast_adapter_dtype=False`.

The simulator refuses, in a line naming the reason, the methods whose PEFT code decides something
from tensor values, which fake tensors do not have (BOFT, WaveFT, UniLoRA, VB-LoRA, AdaMSS): a
`backend=cpu` or `cuda` probe runs them. FROD and SHIRA build sparse tensors, which no backend's
memory tracker counts yet: they are refused everywhere. LoHa and LoKr decide their module dropout
on a draw of one number every forward, which the simulator makes for real
(autofit/simulator/kernel_outputs.py); with a module dropout above 0 which adapters a step runs
is chance, so the simulator takes them only without it (PEFT's default).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from autofit.errors import ConfigError
from autofit.families import is_causal_lm
from autofit.knobs.adapter_file import AdapterFileKnob, read_json, simulated
from autofit.knobs.base import ProbeContext, Refuse, Subject

if TYPE_CHECKING:
    from autofit.run_state import RunState

PEFT_MODE = "peft"  # the train_mode value that reads this knob
CONFIG_NAME = "adapter_config.json"  # what PEFT's save_pretrained names it

# The methods whose PEFT code (peft 0.21) decides something from tensor values, which fake tensors
# do not have: the simulator cannot run them, a CPU or CUDA probe can (but those in SPARSE). Each
# is checked against PEFT's code in tests/test_peft_methods.py (one that starts to trace is seen).
NEEDS_VALUES = {
    "ADAMSS": "clusters each weight's singular vectors with scikit-learn's KMeans, on their values",
    "BOFT": "builds its butterfly permutation matrices by indexing with tensor values",
    "FROD": "picks the sparse entries of its projections with nonzero() on a mask",
    "SHIRA": "picks its sparse entries with torch.where on a random mask",
    "UNILORA": "counts how often each shared index is used (bincount) to scale them",
    "VBLORA": "checks its logits for infinities every forward (a training resumed from top-k)",
    "WAVEFT": "places its spectrum with a mask whose size depends on the indices' values",
}
# The methods that draw one number every forward to decide their module dropout (peft 0.21:
# `torch.rand(1) > module_dropout`): the simulator makes the draw, but with a dropout above 0
# which adapters a step runs is chance, and a step's peak with it.
MODULE_DROPOUT = ("LOHA", "LOKR")
# Of those above, the methods that build sparse tensors, which have no storage for autofit's memory
# tracker (every backend's) to count: no backend measures them yet.
SPARSE = ("FROD", "SHIRA")


# The export targets, each by the name its refusals give it: all build adapter networks of their own.
OWN_NETWORKS = (
    ("simpletuner", "SimpleTuner"),
    ("kohya", "sd-scripts"),
    ("musubi", "musubi-tuner"),
    ("sana", "Sana's train.py"),
    ("diffusers", "the diffusers example scripts"),
    ("trl", "autofit's TRL export"),
    ("axolotl", "autofit's axolotl export"),
    ("torchtune", "autofit's torchtune export"),
    ("litgpt", "LitGPT"),
    ("llamafactory", "autofit's LLaMA-Factory export"),
)


def unread_by(trainer: str) -> Refuse:
    """The refusal of a trainer that builds its own networks: a PEFT file is nothing it reads."""
    return Refuse(f"a PEFT config file is not something {trainer} reads")


def config_file(value: str) -> Path:
    """The file `peft_config=value` names: the path itself, or the config inside a folder."""
    path = Path(value).expanduser()
    return path / CONFIG_NAME if path.is_dir() else path


def read_fields(value: str) -> dict[str, Any]:
    """The config's fields as PEFT saved them, or a ConfigError saying what is wrong, in a line."""
    fields = read_json(
        f"peft_config={value}",
        config_file(value),
        f"a PEFT adapter config, {CONFIG_NAME} or the folder holding one",
    )
    if not isinstance(fields, dict) or not isinstance(fields.get("peft_type"), str):
        raise ConfigError(
            f"peft_config={value}: a PEFT adapter config names its method in a 'peft_type' "
            "field (LORA, IA3, LOHA, ...)"
        )
    return fields


class PeftConfigKnob(AdapterFileKnob):
    name = "peft_config"
    depends_on = ("adapter_dtype", "train_mode")
    help = (
        "the PEFT adapter config (adapter_config.json or its folder) that train_mode=peft "
        "trains: any PEFT method, built by PEFT's own classes"
    )
    mode = PEFT_MODE
    what = "a PEFT adapter config"
    trains = "the adapters a PEFT config declares"
    example = CONFIG_NAME

    def means(self, value: Any, subject: Subject) -> str:
        return f"the adapters {value} declares, built by PEFT"

    def file_reason(self, value: str, context: ProbeContext) -> str | None:
        try:
            fields = read_fields(value)
        except ConfigError as exc:
            return str(exc)
        method = fields["peft_type"]
        targeted = fields.get("target_modules") or fields.get("target_parameters")
        if not targeted and not is_causal_lm(context.model.family):
            # PEFT looks a method's default targets up by a transformers model's model_type
            return (
                f"peft_config={value} names no target_modules, so PEFT takes its defaults for a "
                f"transformers language model's type; {context.model.name} is a "
                f"{context.model.family} model: name its target_modules in the file"
            )
        if method in SPARSE:
            return (
                f"peft_config={value}: PEFT's {method} builds sparse tensors, which have no "
                "storage for autofit's memory tracker to count, on any backend"
            )
        if not simulated(context.backend):
            return None
        if method in NEEDS_VALUES:
            return (
                f"peft_config={value}: PEFT's {method} {NEEDS_VALUES[method]}, which the "
                "simulator's fake tensors do not hold; probe it with backend=cpu or cuda"
            )
        dropout = fields.get("module_dropout", 0.0) if method in MODULE_DROPOUT else 0.0
        if dropout:
            return (
                f"peft_config={value}: PEFT's {method} with module_dropout={dropout} skips each "
                "adapter on a draw every forward, so which adapters a step runs is chance; the "
                "simulator takes module_dropout=0 (a full step); probe it with backend=cpu or cuda"
            )
        return None

    trainers = {
        # The trainers autofit exports to build LoRA (and LyCORIS) networks of their own; a PEFT
        # config of another method is not something they read.
        vocabulary: (lambda v, s, _who=who: unread_by(_who))
        for vocabulary, who in OWN_NETWORKS
    }


def add_peft_adapters(run: RunState, value: str) -> None:
    """PEFT's adapters of the method the config names, built by PEFT on the frozen model."""
    from peft import PeftConfig, get_peft_model
    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING

    # lazy: the knobs load without torch (docs/contributing.md)
    from autofit.run_state import default_dtype

    fields = read_fields(value)
    method = fields["peft_type"]
    if method not in PEFT_TYPE_TO_CONFIG_MAPPING:
        methods = ", ".join(sorted(str(m) for m in PEFT_TYPE_TO_CONFIG_MAPPING))
        raise ConfigError(
            f"peft_config={value}: peft_type {method!r} is not a method of the installed PEFT; "
            f"valid: {methods}"
        )
    # PEFT's own loader (PeftConfig.from_pretrained's last step): the method's config class, with
    # what a newer PEFT wrote and this one lacks dropped, as PEFT drops it, with a warning.
    try:
        config = PeftConfig.from_peft_type(**fields)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"peft_config={value}: PEFT refuses it: {exc}") from None
    # Created in the model's dtype, where PEFT moves each new layer (to its base layer's dtype)
    # before its default autocast_adapter_dtype=True upcasts a 16-bit model's adapters to fp32;
    # their inputs are then cast to fp32 in every adapted layer's forward (adapter_dtype=fp32).
    upcast = run.knobs.get("adapter_dtype", "fp32") == "fp32"
    with default_dtype(run.dtypes.weights), run.device:
        # PEFT's own entry point, as its users and its benchmark call it: the methods that keep
        # state on the tuner (VeRA's shared projections) or wrap the forward (virtual tokens)
        # exist only through it.
        run.wrap_model(lambda model: get_peft_model(model, config, autocast_adapter_dtype=upcast))
