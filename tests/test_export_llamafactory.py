"""`autofit export target=llamafactory`: its configs read by LLaMA-Factory's own argument parser and
model setup (issue 39 item 2), what it refuses, and what a search for it (`trainer=llamafactory`)
searches. The golden files are tests/test_export.py's (CASES)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from llamafactory_env import LLAMAFACTORY, parse
from test_export import (  # noqa: F401 (workdir: a fixture)
    FSDP_SEARCH,
    LLAMA,
    TRL_SEARCH,
    export,
    point_for,
    workdir,
)

from autofit.commands.search import _for_trainer, left_out_by
from autofit.export import TARGETS, unlaunchable, write_export
from autofit.export.base import Refused
from autofit.export.defaults import table
from autofit.gpus import load_gpu
from autofit.knobs import defaults, invalid_reason
from autofit.models import load_preset
from autofit.search.space import load_space

GOLDEN = (
    (TRL_SEARCH, None, None, "llama_lora"),
    (TRL_SEARCH, 2, 8, "llama_lora_checkpointing"),
)
# Two GPUs each, parsed as launched: ZeRO-3 under torchrun, FSDP2 under accelerate with its config.
DISTRIBUTED = (
    (LLAMA, None, 16, "llama_qlora_zero3_nvme"),
    (FSDP_SEARCH, None, None, "llama3b_full_fsdp"),
)
# Runs of the TRL search changed in one way each, parsed beside the golden ones.
CHANGED = (
    {"train_mode": "full"},  # fp32 master weights under bf16 autocast
    {"train_mode": "full", "precision": "bf16_pure", "checkpointing": True},
    {"train_mode": "freeze", "trainable_layers": 3},
    {"train_mode": "dora", "optimizer": "paged_adamw8bit"},
)


def _model_folder(tmp: Path, model: str) -> Path:
    """A local folder with the preset's transformers config.json (in the dtype of the published
    weights, which LLaMA-Factory loads them in), for LLaMA-Factory to read in place of the hub id
    the export names: nothing is downloaded."""
    preset = load_preset(model)
    folder = tmp / "model"
    folder.mkdir(exist_ok=True)
    config = {
        **preset.architecture["config"],
        "model_type": preset.architecture["kind"],
        "torch_dtype": preset.trainers["llamafactory"]["torch_dtype"],
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _job(folder: Path, out: Path, loaded: Any) -> dict[str, Any]:
    job = {
        "config": str(out / "config.yaml"),
        "model": str(_model_folder(folder, loaded.model)),
        "bf16": load_gpu(loaded.gpu).bf16,
    }
    if (out / "accelerate_config.yaml").exists():
        job["accelerate_config"] = str(out / "accelerate_config.yaml")
    return job


def _holds_what_was_measured(seen: dict[str, Any], loaded: Any) -> None:
    """What LLaMA-Factory made of the config is the run autofit measured."""
    config = loaded.config
    assert seen["per_device_train_batch_size"] == loaded.micro_batch
    assert seen["gradient_accumulation_steps"] == loaded.accumulation
    assert seen["world_size"] == loaded.world_size
    assert seen["cutoff_len"] == config["resolution"]
    assert seen["attn_implementation"] == "sdpa"
    assert seen["checkpointing"] is bool(config["checkpointing"])
    if config["checkpointing"]:
        assert seen["use_reentrant"] is False  # non-reentrant, as measured
    mode = config["train_mode"]
    if config["precision"] == "bf16":  # bf16 autocast over fp32 trained weights
        assert seen["bf16"] and not seen["pure_bf16"]
        assert seen["trained_dtypes"] == ["torch.float32"]
    if config["precision"] == "bf16_pure":  # bf16 weights, no autocast
        assert seen["pure_bf16"] and not seen["bf16"]
        assert seen["trained_dtypes"] == ["torch.bfloat16"]
    if mode != "full":
        assert seen["frozen_dtypes"] == ["torch.bfloat16"]  # the published bf16, as measured
    if mode == "freeze":
        layers = loaded.preset.architecture["config"]["num_hidden_layers"]
        trained = list(range(layers - config["trainable_layers"], layers))
        assert seen["finetuning_type"] == "freeze" and seen["trained_layers"] == trained
    if mode in ("lora", "qlora", "dora"):
        assert seen["finetuning_type"] == "lora"
        assert seen["lora_rank"] == seen["lora_alpha"] == config["lora_rank"]
        assert seen["lora_modules"] == sorted(loaded.preset.lora_targets)
    if mode == "qlora":
        quantization = seen["quantization"]
        assert quantization["load_in_4bit"] and quantization["bnb_4bit_quant_type"] == "nf4"
        assert quantization["bnb_4bit_use_double_quant"] is True
        # stored in the compute dtype, which ZeRO-3 partitions
        assert quantization["bnb_4bit_quant_storage"] == "bfloat16"
    if config["zero_stage"]:
        assert seen["zero_stage"] == config["zero_stage"] and not seen["deepspeed_mismatches"]
    launch = seen["launch"]
    assert (launch is not None) is (config["fsdp"] != "off")
    if launch:  # the FSDP plugin accelerate builds from the config it is launched with
        assert launch["num_processes"] == loaded.world_size
        assert launch["mixed_precision"] == {"bf16_pure": "no", "bf16": "bf16"}[config["precision"]]
        assert launch["fsdp_version"] == config["fsdp_version"] == 2
        assert launch["reshard_after_forward"] is (config["fsdp"] == "full_shard")
        assert launch["cpu_offload"] == (
            "CPUOffloadPolicy" if config["fsdp_offload"] == "cpu" else "OffloadPolicy"
        )
        assert launch["transformer_cls_names_to_wrap"] == ["LlamaDecoderLayer"]
        assert launch["cpu_ram_efficient_loading"] is True
        assert launch["activation_checkpointing"] is False  # the layers checkpoint themselves


@pytest.mark.long  # builds LLaMA-Factory's environment once (pip, 10-30 s), then ~40 s
def test_llamafactory_configs_pass_llamafactorys_own_parser(workdir: Path) -> None:  # noqa: F811
    assert f"LLaMA-Factory {LLAMAFACTORY}" in table()["llamafactory"].checked_against
    jobs, points = [], []
    for study, point, batch, case in GOLDEN:
        out = export(workdir, "llamafactory", study, point, batch, case)
        loaded = point_for("llamafactory", study, point, batch)
        jobs.append(_job(workdir, out, loaded))
        points.append(loaded)
    for number, change in enumerate(CHANGED):
        base = point_for("llamafactory", TRL_SEARCH, None)
        loaded = dataclasses.replace(base, config={**base.config, **change})
        out = workdir / "changed" / str(number)
        write_export(TARGETS["llamafactory"].run(loaded, out))
        jobs.append(_job(workdir, out, loaded))
        points.append(loaded)
    for seen, loaded in zip(parse(jobs), points, strict=True):
        _holds_what_was_measured(seen, loaded)
    jobs, points = [], []
    for study, point, batch, case in DISTRIBUTED:
        out = export(workdir, "llamafactory", study, point, batch, case)
        points.append(point_for("llamafactory", study, point, batch))
        jobs.append(_job(workdir, out, points[-1]))
    zero3, fsdp = parse(jobs, processes=2)
    for seen, loaded in zip((zero3, fsdp), points, strict=True):
        _holds_what_was_measured(seen, loaded)
    assert zero3["zero3"] is True


def _written(folder: Path, change: dict[str, Any]) -> dict[str, Any]:
    loaded = point_for("llamafactory", TRL_SEARCH, None)
    changed = dataclasses.replace(loaded, config={**loaded.config, **change})
    plan = TARGETS["llamafactory"].run(changed, folder / "out")
    return yaml.safe_load(plan.files["config.yaml"])


def test_llamafactory_refuses_what_it_does_not_run_as_measured(workdir: Path) -> None:  # noqa: F811
    loaded = point_for("llamafactory", TRL_SEARCH, None)
    for change, knob in (
        ({"loss": "trl_fused"}, "loss"),  # TRL's own LM head
        ({"loss": "chunked"}, "loss"),
        ({"precision": "bf16_pure"}, "precision"),  # PEFT's fp32 adapters on a bf16 model
        ({"precision": "fp32"}, "precision"),  # a LoRA base loaded in its published bf16
        ({"train_mode": "freeze", "precision": "fp16"}, "precision"),  # frozen bf16, not fp16
        ({"train_mode": "qlora", "precision": "fp32"}, "precision"),  # bf16 compute inferred
        ({"train_mode": "qlora", "kbit_prep": "peft"}, "kbit_prep"),  # never called
        ({"offload_activations": "cpu"}, "offload_activations"),  # use_unsloth_gc is another
        ({"resolution": 4100}, "resolution"),  # padded to a multiple of 8
        ({"compile": "regional"}, "compile"),
        ({"checkpointing": True, "checkpoint_interval": 2}, "checkpoint_interval"),
        ({"attention": "math"}, "attention"),
        ({"optimizer": "came"}, "optimizer"),
        ({"optimizer_impl": "for_loop"}, "optimizer_impl"),
        ({"world_size": 2, "fsdp": "full_shard"}, "fsdp"),  # accelerate casts the base to fp32
        # accelerate upcasts pure_bf16's trained weights under mixed precision
        (
            {
                "world_size": 2,
                "fsdp": "full_shard",
                "train_mode": "full",
                "precision": "bf16_autocast",
            },
            "fsdp",
        ),
    ):
        changed = dataclasses.replace(loaded, config={**loaded.config, **change})
        with pytest.raises(Refused) as refused:
            TARGETS["llamafactory"].run(changed, workdir / "out")
        assert refused.value.knob == knob, str(refused.value)
        assert "\n" not in str(refused.value) and "llamafactory offers" in str(refused.value)


def test_llamafactory_refuses_fsdp2_of_an_untied_head(workdir: Path) -> None:  # noqa: F811
    """accelerate 1.11 leaves Llama 3 8B's untied head to the root, gathered through backward."""
    loaded = point_for("llamafactory", FSDP_SEARCH, None)
    untied = dataclasses.replace(loaded, preset=load_preset("llama3_8b"))
    with pytest.raises(Refused, match="fsdp=shard_grad_op of llama3_8b .* untied output head"):
        TARGETS["llamafactory"].run(untied, workdir / "out")
    fsdp1 = dataclasses.replace(untied, config={**untied.config, "fsdp_version": 1})
    plan = TARGETS["llamafactory"].run(fsdp1, workdir / "out")
    launch = yaml.safe_load(plan.files["accelerate_config.yaml"])
    assert launch["fsdp_config"]["fsdp_sharding_strategy"] == "SHARD_GRAD_OP"
    assert plan.command.startswith("accelerate launch --config_file ")


def test_llamafactory_refuses_the_bf16_runs_of_a_model_published_in_fp16(workdir: Path) -> None:  # noqa: F811
    """Llama 2's weights are published in fp16, which LLaMA-Factory loads them in."""
    loaded = point_for("llamafactory", TRL_SEARCH, None)
    llama2 = dataclasses.replace(loaded, preset=load_preset("llama2_7b"))
    with pytest.raises(Refused, match="published float16 .* kept them in bfloat16"):
        TARGETS["llamafactory"].run(llama2, workdir / "out")
    fp16 = dataclasses.replace(llama2, config={**llama2.config, "precision": "fp16"})
    written = yaml.safe_load(
        TARGETS["llamafactory"].run(fp16, workdir / "out").files["config.yaml"]
    )
    assert written["fp16"] is True


def test_llamafactory_says_what_it_runs_as_measured(workdir: Path) -> None:  # noqa: F811
    for change, expected in (
        ({"train_mode": "full", "precision": "bf16_autocast"}, {"pure_bf16": True, "bf16": True}),
        ({"train_mode": "full", "precision": "fp32"}, {"bf16": False, "fp16": False}),
        ({"train_mode": "qdora"}, {"use_dora": True, "quantization_bit": 4}),
        ({"loss": "fused_linear"}, {"enable_liger_kernel": True}),
        ({"optimizer": "paged_adamw8bit"}, {"optim": "paged_adamw_8bit"}),
        ({"optimizer_impl": "foreach"}, {"optim": "adamw_torch"}),
        ({"checkpointing": False}, {"disable_gradient_checkpointing": True}),
        ({"lora_targets": "qv"}, {"lora_target": "q_proj,v_proj"}),
    ):
        written = _written(workdir, change)
        for key, value in expected.items():
            assert written[key] == value, (change, key, written)


def test_zero_offload_has_deepspeed_take_the_trainers_learning_rate(workdir: Path) -> None:  # noqa: F811
    """DeepSpeed's CPU Adam under ZeRO-Offload takes the Trainer's values ('auto'): a value of its
    own that differs is a mismatch the Trainer refuses as it starts."""
    loaded = point_for("llamafactory", LLAMA, None, 16)
    change = {"offload_optimizer": "cpu", "offload_params": "none"}
    changed = dataclasses.replace(loaded, config={**loaded.config, **change})
    plan = TARGETS["llamafactory"].run(changed, workdir / "out")
    optimizer = json.loads(plan.files["ds_config.json"])["optimizer"]
    assert optimizer["type"] == "AdamW" and set(optimizer["params"].values()) == {"auto"}
    assert plan.command.startswith("FORCE_TORCHRUN=1 NPROC_PER_NODE=2 llamafactory-cli train ")


def test_a_search_for_llamafactory_searches_only_what_it_launches() -> None:
    """The quick space's fp16 LoRA is one LLaMA-Factory cannot run on Llama 3.2's bf16 weights:
    the search leaves it out with that reason, and every run it keeps exports."""
    preset, gpu = load_preset("llama3_2_1b"), load_gpu("rtx4090")
    chosen, stack, values, space = _for_trainer("llamafactory", preset, load_space("quick", preset))
    assert chosen is TARGETS["llamafactory"]
    left_out = left_out_by(space, gpu, chosen, preset)
    searched, refused = 0, []
    for combination in space.combinations():
        knobs = {**defaults(), **combination, "resolution": space.resolutions[0]}
        if invalid_reason(knobs, gpu, preset, "simulate") is not None:
            continue
        reason = left_out(knobs)
        if reason is None:
            searched += 1
            assert unlaunchable(chosen, preset, knobs) is None, knobs
        else:
            refused.append(reason)
    assert searched and any("llamafactory cannot run precision=fp16" in r for r in refused)


def test_llamafactory_refuses_the_image_and_video_families() -> None:
    from autofit.errors import ConfigError

    with pytest.raises(
        ConfigError, match="trainer=llamafactory cannot train flux_dev .*families llm"
    ):
        TARGETS["llamafactory"].check_family(load_preset("flux_dev"), setting="trainer")
