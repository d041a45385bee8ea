"""`autofit export target=torchtune`: its configs and launch lines read and built by torchtune's own
config machinery (issue 39 item 2), what it refuses, and what a search for it
(`trainer=torchtune`) searches. The golden files are tests/test_export.py's (CASES)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import trainer_search
from test_export import TORCHTUNE_SEARCH, export, point_for, workdir  # noqa: F401 (a fixture)
from torchtune_env import TORCHTUNE
from torchtune_env import check as torchtune_check

from autofit.errors import ConfigError
from autofit.export import TARGETS, write_export
from autofit.export.base import Refused
from autofit.export.defaults import table
from autofit.export.point import StudyPoint
from autofit.export.torchtune import nested, yaml_lines
from autofit.models import ModelPreset, load_preset

# Runs beside the searched ones: a Qwen2.5 (untied embedding, its own builder) fine-tuned in full
# over two GPUs under FSDP2 with CPU offload and every other layer checkpointed; a DoRA in fp32
# with offloaded activations, an 8-bit paged optimizer and compiled layers.
VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("qwen2_5_7b", {
        "train_mode": "full", "world_size": 2, "fsdp": "shard_grad_op", "fsdp_offload": "cpu",
        "checkpointing": True, "checkpoint_interval": 2, "optimizer_impl": "foreach",
    }),
    ("llama3_2_1b", {
        "train_mode": "dora", "precision": "fp32", "checkpointing": True,
        "offload_activations": "cpu", "optimizer": "paged_adamw8bit", "compile": "regional",
        "lora_targets": "qv", "lora_rank": 8,
    }),
)  # fmt: skip


def _on(point: StudyPoint, model: str, change: dict[str, Any]) -> StudyPoint:
    return dataclasses.replace(point, preset=load_preset(model), config={**point.config, **change})


def _transformers_parameters(preset: ModelPreset) -> int:
    """The parameters of the model autofit measured (transformers', built on the meta device)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    architecture = preset.architecture
    config = AutoConfig.for_model(architecture["kind"], **architecture["config"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _adapter_parameters(
    preset: ModelPreset, rank: int, modules: tuple[str, ...], dora: bool
) -> int:
    """LoRA's A and B of every adapted projection, and DoRA's magnitude per output feature, from
    the architecture's own figures."""
    c = preset.architecture["config"]
    hidden, inner = c["hidden_size"], c["intermediate_size"]
    head = c.get("head_dim", hidden // c["num_attention_heads"])
    q, kv = c["num_attention_heads"] * head, c["num_key_value_heads"] * head
    shapes = {  # (inputs, outputs)
        "q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
        "gate_proj": (hidden, inner), "up_proj": (hidden, inner), "down_proj": (inner, hidden),
    }  # fmt: skip
    per_layer = sum(rank * (shapes[m][0] + shapes[m][1]) + dora * shapes[m][1] for m in modules)
    return c["num_hidden_layers"] * per_layer


@pytest.mark.long  # builds torchtune's environment once (pip, ~10 s), then ~40 s
def test_torchtune_builds_the_exported_runs_with_its_own_config_machinery(
    workdir: Path,  # noqa: F811
) -> None:
    assert f"torchtune {TORCHTUNE}" in table()["torchtune"].checked_against
    points = [
        point_for("torchtune", TORCHTUNE_SEARCH, None),
        point_for("torchtune", TORCHTUNE_SEARCH, 2, 10),
    ]
    points += [_on(points[0], model, change) for model, change in VARIANTS]
    jobs = []
    for number, point in enumerate(points):
        plan = TARGETS["torchtune"].run(point, workdir / f"out{number}")
        write_export(plan)
        jobs.append({"config": str(plan.out / "config.yaml"), "command": plan.command})
    for built, point in zip(torchtune_check(jobs), points, strict=True):
        config, mode = point.config, point.config["train_mode"]
        full = mode == "full"
        distributed = point.world_size > 1
        assert built["recipe"] == (
            f"{'full' if full else 'lora'}_finetune_{'distributed' if distributed else 'single_device'}"
        )
        assert built["nproc"] == point.world_size
        # torchtune's own model of the preset's architecture: the parameters autofit measured
        base = _transformers_parameters(point.preset)
        adapters = 0
        if not full:
            targets = config["lora_targets"]
            modules = ("q_proj", "v_proj") if targets == "qv" else tuple(point.preset.lora_targets)
            adapters = _adapter_parameters(
                point.preset, config["lora_rank"], modules, mode == "dora"
            )
        assert built["dora"] is (mode == "dora")
        assert built["params"] - built["adapter_params"] == base
        assert built["adapter_params"] == adapters
        assert (
            built["model_dtype"]
            == {"bf16_pure": "torch.bfloat16", "fp32": "torch.float32"}[config["precision"]]
        )
        assert built["loss"] == "CEWithChunkedOutputLoss" and built["chunks"] == 8
        assert built["max_seq_len"] == config["resolution"]
        settings = built["recipe_settings"]
        assert settings["batch_size"] == point.micro_batch
        assert settings["gradient_accumulation_steps"] == point.accumulation
        assert settings["compile"] is (config["compile"] == "regional")
        assert settings["enable_activation_offloading"] is (config["offload_activations"] == "cpu")
        every_layer = config["checkpointing"] and config["checkpoint_interval"] == 1
        assert settings["enable_activation_checkpointing"] is every_layer
        if config["checkpoint_interval"] > 1:
            assert (settings["ac_mode"], settings["ac_option"]) == (
                "selective",
                config["checkpoint_interval"],
            )
        if full:
            assert settings["optimizer_in_bwd"] is False
        else:
            assert built["scheduler"] == "LambdaLR"  # the cosine schedule torchtune's configs use
        if distributed:
            assert settings["fsdp_reshard_after_forward"] is (config["fsdp"] == "full_shard")
            assert settings["fsdp_cpu_offload"] is (config["fsdp_offload"] == "cpu")
            assert built["custom_sharded_layers"] == ["tok_embeddings"]  # Qwen2.5 7B: untied
        optimizer = {
            "adamw": "torch.optim.adamw.AdamW",
            "paged_adamw8bit": "bitsandbytes.optim.adamw.PagedAdamW8bit",
        }
        assert built["optimizer"] == optimizer[config["optimizer"]]
        if config["optimizer"] == "adamw":
            implementation = built["optimizer_defaults"]
            assert (implementation["fused"], implementation["foreach"]) == {
                "fused": (True, None), "foreach": (None, True)
            }[config["optimizer_impl"]]  # fmt: skip


def test_torchtune_refuses_what_it_does_not_run_as_measured(workdir: Path) -> None:  # noqa: F811
    loaded = point_for("torchtune", TORCHTUNE_SEARCH, None)
    for change, knob in (
        ({"precision": "bf16"}, "precision"),  # fp32 masters under autocast
        ({"train_mode": "qlora"}, "train_mode"),  # torchao's NF4, not bitsandbytes'
        ({"train_mode": "freeze"}, "train_mode"),
        ({"loss": "full"}, "loss"),  # 0.6.1 has CEWithChunkedOutputLoss only
        ({"loss": "full_native"}, "loss"),  # its labels shift, not a copy of the logits
        ({"attention": "math"}, "attention"),
        ({"optimizer": "adamw_bf16"}, "optimizer"),
        ({"fused_backward": "parameter"}, "fused_backward"),  # LoRA recipes have none
        ({"train_mode": "full", "fused_backward": "block"}, "fused_backward"),
        ({"offload_activations": "cpu"}, "offload_activations"),  # needs checkpointing
        ({"checkpointing": True, "checkpoint_interval": 2}, "checkpoint_interval"),  # one GPU
        ({"checkpointing": True, "checkpoint_policy": "op"}, "checkpoint_policy"),
        ({"zero_stage": 2}, "zero_stage"),
        ({"world_size": 2}, "fsdp"),  # its distributed recipes always shard
        ({"fsdp": "full_shard"}, "fsdp"),  # one GPU runs the single-device recipe
        ({"world_size": 2, "fsdp": "full_shard", "fsdp_version": 1}, "fsdp_version"),
    ):
        changed = dataclasses.replace(loaded, config={**loaded.config, **change})
        with pytest.raises(Refused) as refused:
            TARGETS["torchtune"].run(changed, workdir / "out")
        assert refused.value.knob == knob, str(refused.value)
        assert "\n" not in str(refused.value) and "torchtune offers" in str(refused.value)


def test_the_config_nests_torchtunes_dotted_keys_and_marks_its_defaults() -> None:
    flat = {"epochs": 1, "optimizer._component_": "torch.optim.AdamW", "model.lora_rank": 8,
            "optimizer.lr": 3e-4, "model.lora_attn_modules": ["q_proj", "v_proj"]}  # fmt: skip
    tree = nested(flat)
    assert list(tree) == ["model", "optimizer", "epochs"]  # the shipped configs' order
    lines = yaml_lines(tree, {"optimizer.lr"})
    assert yaml.safe_load("\n".join(lines)) == tree
    assert [line for line in lines if "#" in line] == [
        "  lr: 0.0003  # defaults to review (optimizer.lr)"
    ]


def test_torchtune_refuses_a_model_it_has_no_builder_for_in_one_line() -> None:
    for model, why in (
        ("yi_34b", "torchtune 0.6.1 has no model builder of its architecture"),
        ("mistral_7b_v0_2", "torchtune 0.6.1 has no model builder of its architecture"),
        ("flux_dev", "torchtune supports the families llm"),
    ):
        with pytest.raises(
            ConfigError, match=f"trainer=torchtune cannot train {model} .*{why}"
        ) as e:
            TARGETS["torchtune"].check_family(load_preset(model), setting="trainer")
        assert "\n" not in str(e.value)


def test_a_search_for_torchtune_searches_only_what_it_launches() -> None:
    chosen, _, values, runs = trainer_search("torchtune", "llama3_2_1b", "rtx4090")
    assert chosen is TARGETS["torchtune"]
    assert values["precision"] == ("fp32", "bf16_pure") and values["loss"] == ("chunked",)
    assert runs
    for knobs, why in runs:
        assert why is None, knobs
