"""`target=litgpt`: a LitGPT fine-tuning config (`config.yaml`, litgpt 0.5.13) and the command that
runs it, `litgpt finetune_lora <checkpoint_dir> --config config.yaml` (`finetune_full` for a full
fine-tune).

LitGPT's CLI (jsonargparse over `finetune/lora.py` and `finetune/full.py`'s `setup`) reads one
YAML of setup's arguments: precision, devices, the LoRA rank, alpha, dropout and which projections
it adapts, `train` (TrainArgs: micro and global batch, which give the accumulation, and
max_seq_length), `optimizer` (a class path and its init_args) and `data`. Each knob's litgpt
words give those keys, dotted (`train.micro_batch_size`), which this layout nests. What LitGPT
decides itself and has no key for is checked by the knobs' words against the measured run: its
loss (128-token slices), checkpointing and FSDP exactly when it runs on several devices, no ZeRO,
no activation offload, no 4-bit base autofit measured. The hyperparameters LitGPT's config hub
documents for Llama 3 8B follow, marked as defaults to review.

The checkpoint is LitGPT's own conversion of the published weights (`litgpt download <hub id>`
writes checkpoints/<hub id>), so a preset is exported only where its file names the LitGPT config
of its architecture (`trainers: {litgpt: {config: ...}}` in conf/model/), and never for a model
LitGPT would build larger: LitGPT 0.5.13's GPT has no tied output head (a tied model's head is
copied into a weight of its own by `convert_to_litgpt`), and its mixture of experts runs its
experts otherwise than transformers' fused ones.

Checked against litgpt 0.5.13 (with lightning 2.6.6 and jsonargparse 4.41.0): its own CLI reads the
exported configs, and finetune_lora and finetune_full run two optimizer steps on the CPU from them
on a tiny model of the same LitGPT config (tests/test_export_litgpt.py, in an environment of
LitGPT's pins: tests/litgpt_env.py).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

import yaml

from autofit.export.accelerate import allocator_env
from autofit.export.base import ExportPlan, Target, steps_note, weights
from autofit.models import ModelPreset

DATASET = "path/to/dataset.json"  # placeholder: autofit never sees the user's data
OUTPUT_DIR = "out/autofit"
# LitGPT's fine-tuning command for each train_mode its words run (the others they refuse).
COMMANDS = {"full": "finetune_full", "lora": "finetune_lora"}
DEFAULT = "# defaults to review"  # the mark on each line the trainer's documented values fill
# What the model differs in, said with every export: LitGPT builds its own GPT.
OWN_MODEL = (
    "LitGPT trains its own GPT of this architecture (one fused qkv projection with LoRA on it, "
    "its RMSNorm and RoPE), not the transformers model autofit simulated: the weights, "
    "gradients and optimizer states are the same, the activations LitGPT's (its published "
    "Llama 3 8B LoRA peak is 4.2% above autofit's simulation of the transformers run: "
    "calibration/published.csv LG1)"
)


def litgpt_config(preset: ModelPreset) -> str | None:
    """The LitGPT config of the preset's architecture its file names, or None."""
    return preset.trainers.get("litgpt", {}).get("config")


def unbuilt_reason(preset: ModelPreset) -> str | None:
    """Why LitGPT 0.5.13 would not build the model autofit measured, or None."""
    config = preset.architecture.get("config", {})
    if config.get("tie_word_embeddings"):
        return (
            "LitGPT's GPT has no tied output head (convert_to_litgpt copies the embedding into "
            "lm_head, a vocabulary x hidden weight more than the measured model holds)"
        )
    if "num_experts" in config or "num_local_experts" in config:
        return (
            "LitGPT's LLaMAMoE runs each expert as a module of its own, where the measured "
            "transformers model holds them as fused 3-D weights"
        )
    if litgpt_config(preset) is None:
        return f"autofit knows no LitGPT config of {preset.display}'s architecture"
    return None


def nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Dotted keys (`train.micro_batch_size`) as the nested mappings LitGPT's YAML holds."""
    tree: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = tree
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return tree


def _scalar(value: Any) -> str:
    """One YAML value on one line (a list in flow style)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1_000_000)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def render(tree: Mapping[str, Any], marked: set[str], prefix: str = "") -> list[str]:
    """The nested settings as YAML lines, each dotted key in `marked` with the defaults' mark
    (YAML has no other way to mark a value inside a mapping the knobs also fill)."""
    lines = []
    indent = "  " * prefix.count(".") if prefix else ""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            lines.append(f"{indent}{key}:")
            lines.extend(render(value, marked, f"{path}."))
        else:
            mark = f"  {DEFAULT}" if path in marked else ""
            lines.append(f"{indent}{key}: {_scalar(value)}{mark}")
    return lines


class LitGpt(Target):
    name = "litgpt"
    summary = (
        "a LitGPT config.yaml for litgpt finetune_lora / finetune_full (batch, precision, LoRA, "
        "optimizer)"
    )

    def preset_refusal(self, preset: ModelPreset) -> str | None:
        why = unbuilt_reason(preset)
        return why and f"{why}; {self.name} trains the presets whose file names a LitGPT config"

    def build(self, plan: ExportPlan) -> None:
        point = plan.point
        said = {
            "out_dir": OUTPUT_DIR,
            "num_nodes": 1,  # devices (world_size's words) are one node's
            **plan.say_rest(),
            "data.class_path": "litgpt.data.JSON",
            "data.init_args.json_path": DATASET,
            "data.init_args.val_split_fraction": 0.05,
        }
        defaults = plan.training_defaults(said)
        command = COMMANDS[point.config["train_mode"]]
        checkpoint = f"checkpoints/{weights(plan)}"
        config = plan.out / "config.yaml"
        plan.command = (
            f"{allocator_env(plan)}litgpt {command} {shlex.quote(checkpoint)} "
            f"--config {shlex.quote(str(config))}"
        )
        what = f"{point.label} of autofit study {point.study} ({point.model}, {point.gpu})"
        lines = render(nested({**said, **defaults}), set(defaults))
        heading = (
            f"# {plan.defaults_heading}: {', '.join(defaults)}, each line so marked below.\n"
            if defaults
            else ""
        )
        plan.add(
            "config.yaml",
            f"# LitGPT {command} config for {what}\n# Launch: {plan.command}\n{heading}"
            + "\n".join(lines),
            f"LitGPT's {command} arguments: precision, devices, LoRA, batch, length, optimizer, data",
        )
        plan.warnings.append(OWN_MODEL)
        plan.note(
            f"'{checkpoint}': `litgpt download {weights(plan)}` downloads the weights and "
            f"converts them there (LitGPT's config {litgpt_config(point.preset)})"
        )
        plan.note(
            f"'{DATASET}' in config.yaml: your data as a JSON list of {{instruction, input, "
            "output} records (LitGPT's JSON data module; another litgpt.data class may replace it)"
        )
        steps_note(
            plan,
            "each example is cut to max_seq_length tokens and a micro-batch padded to its longest, "
            "so an epoch is your training examples / that many steps, for train.epochs or "
            "train.max_steps",
        )


TARGET = LitGpt()
