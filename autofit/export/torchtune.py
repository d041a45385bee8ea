"""`target=torchtune`: a torchtune recipe config (`config.yaml`, torchtune 0.6.1) and the
`tune run` line that launches it.

torchtune trains its own model classes, built by the builder of the preset's architecture
(autofit/families/torchtune_builders.py), with one of four recipes: `full_finetune_` or
`lora_finetune_` (LoRA and DoRA), `single_device` on one GPU or `distributed` over
`--nproc_per_node` processes, which shard with FSDP2. The config follows the layout of the
configs torchtune ships for them (recipes/configs/llama3_2/1B_lora_single_device.yaml,
llama3_1/8B_full.yaml): a component section per part (`_component_` and its arguments) and flat
recipe settings. Each knob's torchtune words give their keys in torchtune's dotted override form
(`model.lora_rank`, `optimizer._component_`, the form `tune run ... key=value` takes), which this
layout nests: the builder and its LoRA settings, the tokenizer's max_seq_len, batch and
accumulation, dtype, the optimizer's class and arguments, optimizer_in_bwd, checkpointing and
activation offloading, the chunked loss, compile, and FSDP's resharding and CPU offload. The
checkpoint, tokenizer and dataset paths are placeholders; the learning rate, schedule and epochs
torchtune's configs give for the mode follow, marked as defaults to review.

Checked against torchtune 0.6.1: its config.validate reads the exported configs in
tests/test_export_torchtune.py, which builds the model, optimizer, scheduler and loss from them
with torchtune's own config.instantiate (in an environment of its own: tests/torchtune_env.py).
"""

from __future__ import annotations

import shlex
from typing import Any

import yaml

from autofit.export.accelerate import allocator_env
from autofit.export.base import ExportPlan, Target, steps_note, weights
from autofit.export.defaults import MARK
from autofit.families.torchtune_builders import Builder, builder_for, builder_names
from autofit.models import ModelPreset

DATASET = "path/to/dataset"  # placeholder: autofit never sees the user's data
OUTPUT_DIR = "output/autofit"


def tokenizer(builder: Builder, folder: str) -> dict[str, Any]:
    """The tokenizer section of the builder's model, its files as `tune download` leaves them
    (torchtune 0.6.1's shipped configs for each model)."""
    if builder.module == "qwen2_5":
        return {
            "_component_": "torchtune.models.qwen2_5.qwen2_5_tokenizer",
            "path": f"{folder}/vocab.json",
            "merges_file": f"{folder}/merges.txt",
        }
    if builder.module in ("llama3", "llama3_1", "llama3_2"):
        return {
            "_component_": "torchtune.models.llama3.llama3_tokenizer",
            "path": f"{folder}/original/tokenizer.model",
        }
    return {  # llama2, mistral: a SentencePiece model
        "_component_": f"torchtune.models.{builder.module}.{builder.module}_tokenizer",
        "path": f"{folder}/tokenizer.model",
    }


# The checkpointer's model_type for each builder module (torchtune/training/checkpointing/
# _utils.py ModelType), which says how it converts the Hugging Face weights.
MODEL_TYPES = {
    "llama2": "LLAMA2",
    "llama3": "LLAMA3",
    "llama3_1": "LLAMA3",
    "llama3_2": "LLAMA3_2",
    "mistral": "MISTRAL",
    "qwen2_5": "QWEN2",
}


# The order of the shipped configs' sections; recipe settings follow in the order said.
ORDER = (
    "output_dir", "model", "tokenizer", "checkpointer", "resume_from_checkpoint", "dataset",
    "seed", "shuffle", "batch_size", "optimizer", "lr_scheduler", "loss", "epochs",
    "max_steps_per_epoch", "gradient_accumulation_steps", "clip_grad_norm", "compile",
)  # fmt: skip


def nested(flat: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys (`optimizer.lr`) as the nested sections torchtune's YAML holds, in the
    shipped configs' order."""
    tops = [key.split(".")[0] for key in flat]
    order = [key for key in ORDER if key in tops] + [key for key in tops if key not in ORDER]
    tree: dict[str, Any] = dict.fromkeys(order)  # each top-level key's place
    for key, value in flat.items():
        *sections, leaf = key.split(".")
        node = tree
        for section in sections:
            if node.get(section) is None:
                node[section] = {}
            node = node[section]
        node[leaf] = value
    return tree


def yaml_lines(tree: dict[str, Any], marked: set[str], path: str = "", depth: int = 0) -> list[str]:
    """`tree` as YAML lines, each value whose dotted key is in `marked` commented as a default
    to review (safe_dump writes no comments)."""
    lines = []
    for key, value in tree.items():
        dotted = f"{path}{key}"
        pad = "  " * depth
        if isinstance(value, dict) and value:
            lines.append(f"{pad}{key}:")
            lines += yaml_lines(value, marked, f"{dotted}.", depth + 1)
            continue
        entry = yaml.safe_dump({key: value}, default_flow_style=True, width=10**6).strip()
        mark = f"  # {MARK} ({dotted})" if dotted in marked else ""
        lines.append(f"{pad}{entry[1:-1]}{mark}")
    return lines


class Torchtune(Target):
    name = "torchtune"
    summary = (
        "a torchtune recipe config.yaml (its model builder, LoRA, dtype, optimizer, "
        "checkpointing, offload, chunked loss, FSDP2) and the tune run line"
    )

    def preset_refusal(self, preset: ModelPreset) -> str | None:
        """Beyond the family: torchtune trains a model its builders build."""
        if builder_for(preset) is None:
            return (
                f"torchtune 0.6.1 has no model builder of its architecture; it builds "
                f"{builder_names()}"
            )
        return None

    def build(self, plan: ExportPlan) -> None:
        point = plan.point
        builder = builder_for(point.preset)
        assert builder is not None, "check_family refuses a preset of no builder"
        world = plan.value("world_size")
        full = point.config["train_mode"] == "full"
        recipe = f"{'full' if full else 'lora'}_finetune_{'distributed' if world > 1 else 'single_device'}"
        folder = f"models/{point.model}"  # where `tune download` puts the weights
        said = plan.say_rest()
        settings = {
            "output_dir": OUTPUT_DIR,
            **{f"tokenizer.{k}": v for k, v in tokenizer(builder, folder).items()},
            "checkpointer._component_": "torchtune.training.FullModelHFCheckpointer",
            "checkpointer.checkpoint_dir": folder,
            "checkpointer.checkpoint_files": ["model.safetensors"],
            "checkpointer.recipe_checkpoint": None,
            "checkpointer.output_dir": "${output_dir}",
            "checkpointer.model_type": MODEL_TYPES[builder.module],
            "resume_from_checkpoint": False,
            "dataset._component_": "torchtune.datasets.text_completion_dataset",
            "dataset.source": DATASET,
            "dataset.column": "text",
            "dataset.split": "train",
            "seed": None,
            "shuffle": True,
            "max_steps_per_epoch": None,
            "clip_grad_norm": None,  # optimizer_in_bwd runs only without clipping
            "device": "cuda",
            "metric_logger._component_": "torchtune.training.metric_logging.DiskLogger",
            "metric_logger.log_dir": "${output_dir}/logs",
            "log_every_n_steps": 1,
            "log_peak_memory_stats": True,
            **({} if full else {"save_adapter_weights_only": False}),
            **said,
        }
        defaults = plan.training_defaults(settings)
        config = plan.out / "config.yaml"
        launch = f"--nproc_per_node {world} " if world > 1 else ""
        plan.command = (
            f"{allocator_env(plan)}tune run {launch}{recipe} --config {shlex.quote(str(config))}"
        )
        what = f"{point.label} of autofit study {point.study} ({point.model}, {point.gpu})"
        body = yaml_lines(nested({**settings, **defaults}), set(defaults))
        plan.add(
            "config.yaml",
            f"# torchtune {recipe} config for {what}\n# Launch: {plan.command}\n"
            + (f"# {plan.defaults_heading}; each is marked\n" if defaults else "")
            + "\n".join(body),
            f"torchtune's recipe config for {recipe}: model builder, tokenizer, checkpointer, "
            "dataset, batch, dtype, optimizer and memory settings",
        )
        plan.note(
            f"weights: `tune download {weights(plan)} --output-dir {folder}`, then list the "
            f".safetensors files it wrote in checkpointer.checkpoint_files of config.yaml"
        )
        plan.note(
            f"'{DATASET}' in config.yaml: your dataset for torchtune's text_completion_dataset "
            "(a hub id, or 'json' with data_files) with a 'text' column, or another of torchtune's "
            "dataset builders (alpaca_dataset, chat_dataset, ...)"
        )
        steps_note(
            plan,
            "each example is cut to the tokenizer's max_seq_len and a batch padded to its longest "
            "(rows no longer than measured), so an epoch is your examples / that many steps, for "
            "epochs or max_steps_per_epoch; dataset.packed: true would fill every row but runs "
            "flex attention with a block mask, which autofit has not measured",
        )


TARGET = Torchtune()
