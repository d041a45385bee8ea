"""What every exporter shares: the contract of a target, and the plan it fills in.

An export never drops a knob silently. A target reads each knob through its `Plan`:
`plan.value(knob)` when the trainer expresses it, `plan.warn(knob, why)` when the trainer cannot
but the run it launches trains the same weights the same way in no more memory than was measured
(the attention kernel the trainer picks, say), `plan.refuse(knob, why)` when the run would differ
from the measured one (ZeRO without DeepSpeed, a weight dtype the trainer does not have, more
memory). After `build`, any knob of the configuration the target did not read is an error: a knob
newer than the exporter must not vanish from the export.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from autofit.errors import ConfigError
from autofit.export.point import DEFAULTS, StudyPoint
from autofit.units import value as knob_text  # a knob value as the command line writes it


@dataclass
class Plan:
    """What one export writes: files, the launch command, warnings, and the settings the user's own
    code must apply. `out` is the folder the files go to, as the user will type it."""

    target: str
    point: StudyPoint
    out: Path
    files: dict[str, str] = field(default_factory=dict)
    descriptions: dict[str, str] = field(default_factory=dict)
    command: str = ""
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    read: set[str] = field(default_factory=set)

    def value(self, knob: str) -> Any:
        """The knob's value, which the target now expresses."""
        self.read.add(knob)
        return self.point.config[knob]

    def warn(self, knob: str, why: str) -> None:
        """The trainer cannot express this value, and the run is the measured one all the same."""
        self.read.add(knob)
        self.warnings.append(f"{knob}={knob_text(self.point.config[knob])}: {why}")

    def refuse(self, knob: str, why: str) -> NoReturn:
        """The trainer cannot express this value, and the run would not be the measured one."""
        value = knob_text(self.point.config[knob])
        raise ConfigError(
            f"target={self.target} cannot express {knob}={value} of {self.point.model} "
            f"({self.point.label} of {self.point.study}): {why}"
        )

    def note(self, text: str) -> None:
        """A setting the user's own code or command applies (the target has no file for it)."""
        self.notes.append(text)

    def add(self, name: str, text: str, description: str) -> Path:
        """Write `text` to `name` in the export; return the path the user will type."""
        self.files[name] = text if text.endswith("\n") else text + "\n"
        self.descriptions[name] = description
        return self.out / name


class Target:
    """One trainer autofit exports to.

    Subclasses set `name`, `summary` (one line for --help and the README) and `families`: the
    model families the trainer can train, each mapped to what the trainer calls it (None: any
    family, for targets that configure the user's own code). `build` reads every knob of
    `plan.point.config` through `plan` (see the module docstring), adds the files with
    `plan.add`, and sets `plan.command` to the shell line that launches training with them.
    """

    name: str = ""
    summary: str = ""
    families: dict[str, str] | None = None

    def check_family(self, point: StudyPoint) -> None:
        if self.families is None or point.family in self.families:
            return
        supported = ", ".join(sorted(self.families)) or "none"
        raise ConfigError(
            f"target={self.name} cannot train {point.model} ({point.preset.display}, family "
            f"{point.family}): {self.name} supports the families {supported}"
        )

    def build(self, plan: Plan) -> None:
        raise NotImplementedError

    def run(self, point: StudyPoint, out: Path) -> Plan:
        """Plan the export of `point` into `out`; nothing is written yet."""
        self.check_family(point)
        plan = Plan(self.name, point, out)
        self.build(plan)
        unread = [k for k in point.config if k not in plan.read]
        if unread:
            knobs = ", ".join(f"{k}={knob_text(point.config[k])}" for k in unread)
            raise ConfigError(
                f"target={self.name} does not know the knob(s) {knobs} of {point.model}: "
                "this exporter predates them, and dropping them would export a different run"
            )
        assert plan.command, f"target {self.name} set no launch command"
        return plan


# --- facts several targets share --------------------------------------------------------------

# The published weights each shipped preset's architecture comes from (autofit trains random
# weights of the same shape; a trainer needs the real ones).
WEIGHTS = {
    "sana_1600m": "Efficient-Large-Model/Sana_1600M_1024px_diffusers",
    "sana_600m": "Efficient-Large-Model/Sana_600M_1024px_diffusers",
    "sd35_medium": "stabilityai/stable-diffusion-3.5-medium",
    "sd35_large": "stabilityai/stable-diffusion-3.5-large",
    "flux_dev": "black-forest-labs/FLUX.1-dev",
    "sdxl": "stabilityai/stable-diffusion-xl-base-1.0",
    "llama3_8b": "meta-llama/Meta-Llama-3-8B",
    "qwen2_5_7b": "Qwen/Qwen2.5-7B",
}
DATA_DIR = "path/to/images"  # placeholder: autofit never sees the user's data


def weights(plan: Plan) -> str:
    """The weights to train: the preset's published ones, or a placeholder and a note."""
    known = WEIGHTS.get(plan.point.model)
    if known:
        return known
    placeholder = f"path/to/{plan.point.model}"
    plan.note(
        f"autofit does not know where the weights of {plan.point.model} are published: replace "
        f"'{placeholder}' with their path or hub id"
    )
    return placeholder


def mixed_precision(plan: Plan) -> str:
    """accelerate's `mixed_precision` for the run: the autocast dtype, or `no`.

    Under ZeRO, DeepSpeed runs the model in 16-bit with fp32 master weights; that is what the
    probe measured for precision bf16 or fp16 with zero_stage >= 1, and what accelerate sets up
    from the same value. `bf16_pure` runs no autocast: the weights themselves are bf16, which the
    training code decides (a note says so).
    """
    precision = plan.value("precision")
    if precision == "bf16_pure":
        plan.note(
            "precision=bf16_pure: create the model in bf16 (weights, gradients and optimizer "
            "states in bf16, no autocast); the launcher's mixed_precision stays 'no'"
        )
        return "no"
    return {"fp32": "no", "fp16": "fp16", "bf16": "bf16"}[precision]


# What the user's own training code must do for each knob, for targets that configure only the
# launcher (accelerate, DeepSpeed): the probe measured exactly these.
OPTIMIZER_CLASSES = {
    "adamw": "torch.optim.AdamW(fused=True)",
    "adamw8bit": "bitsandbytes.optim.AdamW8bit",
    "paged_adamw8bit": "bitsandbytes.optim.PagedAdamW8bit",
    "adafactor": "transformers.optimization.Adafactor(relative_step=False, scale_parameter=False, warmup_init=False)",
    "came": "came_pytorch.CAME",
    "lion": "lion_pytorch.Lion",
    "lion8bit": "bitsandbytes.optim.Lion8bit",
    "adamw_bf16": "an AdamW keeping bf16 states with stochastic rounding (SimpleTuner's adamw_bf16)",
    "sgd": "torch.optim.SGD(momentum=0.9)",
}


def script_settings(plan: Plan, knobs: list[str]) -> None:
    """Note, for each knob, what the training script must do to run what the probe measured."""
    config = plan.point.config
    language = plan.point.family == "llm"
    say = {
        "batch_size": lambda v: f"batch_size={v}: {v} samples per GPU per step (the micro-batch)",
        "resolution": lambda v: (
            f"resolution={v}: sequences of {v} tokens"
            if language
            else f"resolution={v}: {v}x{v} pixel images (or buckets of at most {v}x{v} pixels)"
        ),
        "optimizer": lambda v: f"optimizer={v}: {OPTIMIZER_CLASSES.get(v, v)}",
        "checkpointing": lambda v: (
            f"checkpointing={knob_text(v)}: gradient checkpointing "
            + ("on every transformer block" if v else "off")
        ),
        "train_mode": lambda v: {
            "full": "train_mode=full: every weight of the model trains",
            "lora": "train_mode=lora: LoRA adapters on the frozen 16-bit model (fp32 adapters under mixed precision)",
            "qlora": "train_mode=qlora: LoRA adapters on a 4-bit NF4 base (bitsandbytes, double quantization)",
        }[v],
        "lora_rank": lambda v: f"lora_rank={v}: the rank of the LoRA adapters",
        "encoders": lambda v: {
            "cached": "encoders=cached: latents and text embeddings computed beforehand; only the trained model on the GPU",
            "online": "encoders=online: the text encoders and VAE on the GPU, encoding every batch",
        }[v],
        "ema": lambda v: {
            "off": "ema=off: no EMA copy of the weights",
            "gpu": "ema=gpu: an EMA copy of the trained weights on the GPU",
            "cpu": "ema=cpu: an EMA copy of the trained weights in host memory, updated there",
        }[v],
        "validation": lambda v: (
            f"validation={v}: "
            + ("render validation images during training" if v == "on" else "no validation images")
        ),
        "attention": lambda v: {
            "sdpa": "attention=sdpa: torch's fused scaled_dot_product_attention",
            "math": "attention=math: the unfused attention path (the full attention matrix)",
        }[v],
        "swap_blocks": lambda v: (
            f"swap_blocks={v}: "
            + (
                f"keep the last {v} transformer blocks in host memory and stream them in"
                if v
                else "no block swap"
            )
        ),
    }
    for knob in knobs:
        value = plan.value(knob)
        # A knob at its default asks nothing of the script (no EMA, no block swap, ...).
        if DEFAULTS.get(knob, object()) == value and knob != "encoders":
            continue
        if knob == "lora_rank" and config["train_mode"] == "full":
            continue
        if knob == "encoders" and not getattr(plan.point.preset, "companions", None):
            continue  # the model has no frozen encoders to cache
        plan.note(say[knob](value))
