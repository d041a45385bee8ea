"""`autofit export target=axolotl`: its configs read by axolotl's own validation (issue 39 item 2),
what it refuses, and what a search for it (`trainer=axolotl`) searches. The golden files are
tests/test_export.py's (CASES)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from axolotl_env import AXOLOTL
from axolotl_env import validate as axolotl_validate
from helpers import trainer_search
from test_export import (  # noqa: F401 (workdir: a fixture)
    FSDP_SEARCH,
    LLAMA,
    TRL_SEARCH,
    export,
    point_for,
    workdir,
)

from autofit.export import TARGETS
from autofit.export.base import Refused
from autofit.export.defaults import table
from autofit.models import load_preset

CASES = (
    (TRL_SEARCH, None, None, "llama_lora"),
    (TRL_SEARCH, 2, 8, "llama_lora_checkpointing"),
    (LLAMA, None, 16, "llama_qlora_zero3_nvme"),
    (FSDP_SEARCH, None, None, "llama3b_full_fsdp"),
)
# What axolotl calls the GPUs of the fixed studies (its capabilities' compute_capability).
CAPABILITY = {"rtx4090": "sm_89", "a40": "sm_86", "a100_80": "sm_80"}


def _model_folder(tmp: Path, model: str) -> Path:
    """A local folder with the preset's transformers config.json, for axolotl to read in place of
    the hub id the export names (nothing is downloaded)."""
    architecture = load_preset(model).architecture
    folder = tmp / "model"
    folder.mkdir(exist_ok=True)
    config = {**architecture["config"], "model_type": architecture["kind"]}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.long  # builds axolotl's environment once (pip, about a minute), then ~30 s
def test_axolotl_configs_pass_axolotls_own_validation(workdir: Path) -> None:  # noqa: F811
    assert f"axolotl {AXOLOTL}" in table()["axolotl"].checked_against
    jobs, points = [], []
    for study, point, batch, case in CASES:
        out = export(workdir, "axolotl", study, point, batch, case)
        loaded = point_for("axolotl", study, point, batch)
        jobs.append(
            {
                "config": str(out / "config.yaml"),
                "model": str(_model_folder(workdir, loaded.model)),
                "n_gpu": loaded.world_size,
                "compute_capability": CAPABILITY[loaded.gpu],
            }
        )
        points.append(loaded)
    for cfg, loaded in zip(axolotl_validate(jobs), points, strict=True):
        assert cfg["micro_batch_size"] == loaded.micro_batch
        assert cfg["gradient_accumulation_steps"] == loaded.accumulation
        assert cfg["sequence_len"] == loaded.config["resolution"]
        assert cfg["torch_dtype"] == "torch.bfloat16"  # a bf16 model
        assert cfg["model_config_type"] == "llama"
        if loaded.config["fsdp"] != "off":
            _shards_as_measured(cfg, loaded)
            continue
        assert cfg["bf16"] is True  # precision=bf16: autocast over it
        assert cfg["lora_r"] == cfg["lora_alpha"] == loaded.config["lora_rank"]
        # peft's layers as measured, not axolotl's fused LoRA kernels it would turn on
        assert not any(cfg[f"lora_{k}_kernel"] for k in ("mlp", "qkv", "o", "embedding"))
        if loaded.config["checkpointing"]:
            # said outright: normalize_config would make it reentrant
            assert cfg["gradient_checkpointing_kwargs"] == {"use_reentrant": False}
        if loaded.config["train_mode"] == "qlora":
            assert cfg["adapter"] == "qlora" and cfg["load_in_4bit"] is True
            assert cfg["bnb_config_kwargs"]["bnb_4bit_quant_type"] == "nf4"
        if loaded.config["zero_stage"]:
            # normalize_config reads the JSON the config names
            zero = cfg["deepspeed"]["zero_optimization"]
            assert zero["stage"] == loaded.config["zero_stage"]
            assert zero["offload_param"]["device"] == loaded.config["offload_params"]
            assert cfg["activation_offloading"] is True


def _shards_as_measured(cfg: dict, loaded: Any) -> None:
    """The FSDP plugin axolotl's Trainer gets is the FSDP2 measured: the full fine-tune's bf16
    weights (bf16_pure: no autocast) in each decoder layer's group, kept gathered from forward to
    backward under shard_grad_op, no offload, loaded on rank 0 and sharded from there."""
    assert loaded.config["train_mode"] == "full" and loaded.config["precision"] == "bf16_pure"
    assert cfg["bf16"] is False and cfg.get("adapter") is None
    assert cfg["gradient_checkpointing_kwargs"] == {"use_reentrant": False}
    plugin = cfg["fsdp_plugin"]
    assert plugin["fsdp_version"] == 2
    assert plugin["reshard_after_forward"] is (loaded.config["fsdp"] == "full_shard")
    assert plugin["cpu_offload"] == (
        "CPUOffloadPolicy" if loaded.config["fsdp_offload"] == "cpu" else "OffloadPolicy"
    )
    assert plugin["auto_wrap_policy"] == "transformer_auto_wrap_policy"
    assert plugin["transformer_cls_names_to_wrap"] == ["LlamaDecoderLayer"]
    assert plugin["cpu_ram_efficient_loading"] is True
    assert plugin["activation_checkpointing"] is False  # the layers checkpoint themselves


def test_axolotl_refuses_what_it_does_not_run_as_measured(workdir: Path) -> None:  # noqa: F811
    loaded = point_for("axolotl", TRL_SEARCH, None)
    for change, knob in (
        ({"loss": "trl_fused"}, "loss"),  # TRL's own LM head
        ({"loss": "chunked"}, "loss"),  # axolotl chunks the logits of one whole projection
        ({"train_mode": "full"}, "precision"),  # bf16 model with fp32 embeddings and norms
        ({"train_mode": "qlora", "precision": "fp32"}, "precision"),  # fp32 compute dtype
        ({"train_mode": "qlora", "kbit_prep": "peft"}, "kbit_prep"),  # the fp32 casts undone
        ({"compile": "regional"}, "compile"),
        ({"checkpointing": True, "checkpoint_interval": 2}, "checkpoint_interval"),
        ({"attention": "math"}, "attention"),
        ({"optimizer_impl": "for_loop"}, "optimizer_impl"),
        ({"world_size": 2, "fsdp": "full_shard", "fsdp_version": 1}, "fsdp_version"),  # no prefetch
        ({"world_size": 2, "fsdp": "full_shard", "optimizer": "adamw8bit"}, "optimizer"),
        # a full fine-tune's bf16 weights sharded and stepped as loaded: no fp32 masters
        ({"world_size": 2, "fsdp": "shard_grad_op", "train_mode": "full"}, "precision"),
    ):
        changed = dataclasses.replace(loaded, config={**loaded.config, **change})
        with pytest.raises(Refused) as refused:
            TARGETS["axolotl"].run(changed, workdir / "out")
        assert refused.value.knob == knob, str(refused.value)
        assert "\n" not in str(refused.value) and "axolotl offers" in str(refused.value)
    # Llama 3 8B's untied head stays gathered in the root through backward
    untied = dataclasses.replace(
        loaded,
        preset=load_preset("llama3_8b"),
        config={**loaded.config, "world_size": 2, "fsdp": "shard_grad_op"},
    )
    for changed, knob in ((untied, "fsdp"),):
        with pytest.raises(Refused) as refused:
            TARGETS["axolotl"].run(changed, workdir / "out")
        assert refused.value.knob == knob, str(refused.value)
        assert "\n" not in str(refused.value) and "axolotl offers" in str(refused.value)


def test_axolotl_says_what_it_runs_as_measured(workdir: Path) -> None:  # noqa: F811
    loaded = point_for("axolotl", TRL_SEARCH, None)
    for change, expected in (
        ({"precision": "bf16_autocast"}, {"bf16": True, "peft_autocast_adapter_dtype": False}),
        ({"precision": "bf16_pure"}, {"bf16": False, "bfloat16": True}),
        ({"train_mode": "full", "precision": "fp32"}, {"bf16": False, "fp16": False}),
        ({"train_mode": "qdora"}, {"adapter": "qlora", "peft_use_dora": True}),
        ({"loss": "fused_linear"}, {"liger_fused_linear_cross_entropy": True}),
        ({"optimizer": "paged_adamw8bit"}, {"optimizer": "paged_adamw_8bit"}),
        ({"optimizer": "came"}, {"optimizer": "came_pytorch"}),
        ({"optimizer_impl": "foreach"}, {"optimizer": "adamw_torch"}),
    ):
        changed = dataclasses.replace(loaded, config={**loaded.config, **change})
        plan = TARGETS["axolotl"].run(changed, workdir / "out")
        written = yaml.safe_load(plan.files["config.yaml"])
        for key, value in expected.items():
            assert written[key] == value, (change, key, written)


def test_a_search_for_axolotl_searches_only_what_it_launches() -> None:
    chosen, _, _, runs = trainer_search("axolotl", "llama3_2_1b", "rtx4090")
    assert chosen is TARGETS["axolotl"]
    assert runs
    for knobs, why in runs:
        assert why is None, knobs


def test_axolotl_refuses_the_image_and_video_families() -> None:
    from autofit.errors import ConfigError

    with pytest.raises(ConfigError, match="trainer=axolotl cannot train flux_dev .*families llm"):
        TARGETS["axolotl"].check_family(load_preset("flux_dev"), setting="trainer")
