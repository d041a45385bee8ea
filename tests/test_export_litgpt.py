"""`autofit export target=litgpt`: its configs read by LitGPT's own CLI (issue 39 item 2), run for
two optimizer steps on the CPU by LitGPT itself (item 3), what it refuses, and what a search for
it (`trainer=litgpt`) searches (item 4). The golden files are tests/test_export.py's (CASES)."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import trainer_search
from litgpt_env import LITGPT, check, litgpt
from test_export import LITGPT_SEARCH, export, point_for, workdir  # noqa: F401 (a fixture)

from autofit.errors import ConfigError
from autofit.export import TARGETS
from autofit.export.base import Refused
from autofit.export.defaults import table
from autofit.export.litgpt import litgpt_config
from autofit.models import ModelPreset, load_preset
from autofit.paths import group_options

# A full fine-tune on four GPUs, as LitGPT's finetune_full shards it (FSDP1, every block
# checkpointed), from the LoRA search's best.
FULL_FSDP = {
    "train_mode": "full",
    "precision": "bf16_pure",
    "loss": "full_native",
    "world_size": 4,
    "fsdp": "full_shard",
    "fsdp_version": 1,
    "checkpointing": True,
}


def _named() -> list[ModelPreset]:
    """The shipped presets whose file names a LitGPT config."""
    return [p for p in map(load_preset, group_options("model")) if litgpt_config(p)]


def _changed(change: dict[str, Any]) -> Any:
    loaded = point_for("litgpt", LITGPT_SEARCH, None)
    return dataclasses.replace(loaded, config={**loaded.config, **change})


def _written(plan: Any) -> dict[str, Any]:
    return yaml.safe_load(plan.files["config.yaml"])  # type: ignore[no-any-return]


def test_litgpt_refuses_what_it_does_not_run_as_measured(workdir: Path) -> None:  # noqa: F811
    for change, knob in (
        ({"train_mode": "qlora"}, "train_mode"),  # quantized head, trained StableEmbedding
        ({"train_mode": "dora"}, "train_mode"),
        ({"precision": "bf16"}, "precision"),  # bf16-mixed: an fp32 frozen base
        ({"precision": "bf16_autocast"}, "precision"),
        ({"loss": "full"}, "loss"),  # finetune_lora's own 128-token slices
        ({"checkpointing": True}, "checkpointing"),  # none on one device
        ({"attention": "math"}, "attention"),
        ({"compile": "regional"}, "compile"),
        ({"optimizer": "lorafa"}, "optimizer"),
        ({"offload_activations": "cpu"}, "offload_activations"),
        ({"world_size": 2, "zero_stage": 2, "checkpointing": True}, "zero_stage"),
        ({"lora_targets": "qv", "lora_rank": 8, "fsdp": "full_shard"}, "fsdp"),  # one GPU
        ({**FULL_FSDP, "train_mode": "lora", "loss": "chunked_native"}, "fsdp"),  # its groups
        ({**FULL_FSDP, "fsdp": "shard_grad_op"}, "fsdp"),
        ({**FULL_FSDP, "fsdp_version": 2}, "fsdp_version"),
        ({**FULL_FSDP, "checkpointing": False}, "checkpointing"),
        ({**FULL_FSDP, "loss": "chunked_native"}, "loss"),
    ):
        with pytest.raises(Refused) as refused:
            TARGETS["litgpt"].run(_changed(change), workdir / "out")
        assert refused.value.knob == knob, (change, str(refused.value))
        assert "\n" not in str(refused.value) and "litgpt offers" in str(refused.value)


def test_litgpt_says_what_it_runs_as_measured(workdir: Path) -> None:  # noqa: F811
    for change, expected in (
        ({"precision": "fp32"}, {"precision": "32-true"}),
        ({"lora_targets": "qv"}, {"lora_query": True, "lora_key": False, "lora_mlp": False}),
        ({"lora_targets": "mlp"}, {"lora_query": False, "lora_mlp": True}),
        ({"optimizer": "paged_adamw8bit"}, {"optimizer": "bitsandbytes.optim.PagedAdamW8bit"}),
        ({"optimizer": "sgd"}, {"optimizer": "torch.optim.SGD", "momentum": 0.9}),
        ({"optimizer_impl": "foreach"}, {"optimizer": "torch.optim.AdamW", "fused": None}),
        ({"optimizer_impl": "for_loop"}, {"foreach": False}),
        ({"batch_size": 2, "world_size": 1}, {"micro_batch_size": 2, "global_batch_size": 2}),
        ({**FULL_FSDP, "precision": "bf16"}, {"precision": "bf16-mixed", "devices": 4}),
    ):
        plan = TARGETS["litgpt"].run(_changed(change), workdir / "out")
        written = _written(plan)
        train, init = written["train"], written["optimizer"].get("init_args", {})
        found = {
            **{k: written.get(k) for k in expected if not k.startswith("lora") or k in written},
            "optimizer": written["optimizer"]["class_path"],
            "micro_batch_size": train["micro_batch_size"],
            "global_batch_size": train["global_batch_size"],
            **{k: init.get(k) for k in ("momentum", "fused", "foreach")},
        }
        for key, value in expected.items():
            assert found[key] == value, (change, key, written)
        finetune = "finetune_full" if change.get("train_mode") == "full" else "finetune_lora"
        assert plan.command.startswith(f"litgpt {finetune} checkpoints/meta-llama/")


def test_a_search_for_litgpt_searches_only_what_it_launches() -> None:
    chosen, stack, values, runs = trainer_search("litgpt", "llama3_8b", "a100_80")
    assert chosen is TARGETS["litgpt"]
    assert stack == {"loss": "chunked_native"}  # finetune_lora's own loss
    assert values["precision"] == ("fp32", "bf16_pure")  # 32-true and bf16-true
    refused = {why and why.split(":")[0] for _, why in runs}
    # the space's checkpointing=true the search records as invalid: none on one device
    assert any(why is None for _, why in runs)
    assert refused == {None, "litgpt cannot run checkpointing=true"}


def test_litgpt_trains_only_models_it_builds_as_measured() -> None:
    target = TARGETS["litgpt"]
    for model, why in (
        ("llama3_2_1b", "no tied output head"),  # convert_to_litgpt unties it
        ("qwen3_30b_a3b", "LLaMAMoE"),
        ("yi_34b", "no LitGPT config"),
        ("flux_dev", "families llm"),
    ):
        with pytest.raises(ConfigError, match=f"trainer=litgpt cannot train {model} .*{why}"):
            target.check_family(load_preset(model), setting="trainer")
    named = _named()
    assert "llama3_8b" in [p.name for p in named] and len(named) == 8
    for preset in named:
        target.check_family(preset)


@pytest.fixture(scope="module")
def litgpt_facts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """From one LitGPT process (building its environment first, about 10 s with pip): a tiny
    checkpoint of Llama 3 8B's LitGPT config where the export's command looks for it (its folder
    under checkpoints/, data.json beside it), and the sizes of every preset's LitGPT config."""
    root = tmp_path_factory.mktemp("litgpt")
    folder = root / "checkpoints" / "Meta-Llama-3-8B"
    names = [litgpt_config(p) for p in _named()]
    printed = check([str(folder), "Llama-3-8B", *names], root)  # type: ignore[list-item]
    return folder, yaml.safe_load(printed.splitlines()[-1])


@pytest.mark.long  # the module's LitGPT process (litgpt_facts)
def test_presets_name_the_litgpt_config_of_their_architecture(
    litgpt_facts: tuple[Path, dict[str, Any]],
) -> None:
    presets, sizes = _named(), litgpt_facts[1]
    for preset in presets:
        config, kind = preset.architecture["config"], preset.architecture["kind"]
        heads = config["num_attention_heads"]
        litgpt_sizes = sizes[litgpt_config(preset)]
        assert litgpt_sizes == {
            **litgpt_sizes,
            "n_layer": config["num_hidden_layers"],
            "n_embd": config["hidden_size"],
            "intermediate_size": config["intermediate_size"],
            "n_head": heads,
            "n_query_groups": config["num_key_value_heads"],
            "head_size": config.get("head_dim", config["hidden_size"] // heads),
            "padded_vocab_size": config["vocab_size"],
            "attn_bias": kind == "qwen2",  # transformers' Qwen2 has q, k and v biases
            "bias": False,
            "mlp_class_name": "LLaMAMLP",
            "n_expert": 0,
        }, preset.name
        # `litgpt download <weights>` converts by the repository's name (Config.from_name)
        known = (litgpt_config(preset), litgpt_sizes["hf_config"]["name"])
        assert preset.weights.split("/")[-1] in known, preset.name


def _print_config(out: Path, folder: Path) -> dict[str, Any]:
    """The exported command's arguments as LitGPT's CLI parses them (jsonargparse over its
    finetune setup), printed instead of run: `--print_config` after them."""
    command = shlex.split(out.joinpath("config.yaml").read_text().splitlines()[1])
    assert command[:2] == ["#", "Launch:"] and command[2] == "litgpt"
    return yaml.safe_load(litgpt([*command[3:], "--print_config"], folder))  # type: ignore[no-any-return]


@pytest.mark.long
def test_litgpt_configs_pass_litgpts_own_cli(workdir: Path) -> None:  # noqa: F811
    assert f"litgpt {LITGPT}" in table()["litgpt"].checked_against
    out = export(workdir, "litgpt", LITGPT_SEARCH, None, None, "llama_lora")
    loaded = point_for("litgpt", LITGPT_SEARCH, None)
    parsed = _print_config(out, workdir)
    assert (
        parsed["precision"]
        == {"bf16_pure": "bf16-true", "fp32": "32-true"}[loaded.config["precision"]]
    )
    assert parsed["train"]["micro_batch_size"] == loaded.micro_batch
    assert parsed["train"]["global_batch_size"] == loaded.global_batch
    assert parsed["train"]["max_seq_length"] == loaded.config["resolution"]
    assert parsed["lora_r"] == parsed["lora_alpha"] == loaded.config["lora_rank"]
    assert parsed["lora_dropout"] == 0.0 and parsed["quantize"] is None
    assert parsed["optimizer"]["class_path"] == "torch.optim.AdamW"
    assert parsed["optimizer"]["init_args"]["fused"] is True
    assert parsed["data"]["class_path"] == "litgpt.data.JSON"
    full = TARGETS["litgpt"].run(_changed(FULL_FSDP), workdir / "full")
    (workdir / "full").mkdir()
    (workdir / "full" / "config.yaml").write_text(full.files["config.yaml"])
    parsed = _print_config(workdir / "full", workdir)
    assert parsed["devices"] == 4 and parsed["precision"] == "bf16-true"
    assert parsed["train"]["global_batch_size"] == 4 * loaded.micro_batch * loaded.accumulation
    assert "lora_r" not in parsed  # finetune_full's own arguments


def _two_steps(config: str, finetune: str, checkpoint: Path, folder: Path) -> str:
    """The exported command on a tiny checkpoint of the same LitGPT config, for two optimizer
    steps on the CPU with the tiny data set: the rest as exported."""
    (folder / "config.yaml").write_text(config)
    command = shlex.split(config.splitlines()[1])[2:]
    assert command[1] == finetune and Path(command[2]).name == checkpoint.name
    return litgpt(
        [
            finetune, str(checkpoint), "--config", str(folder / "config.yaml"),
            f"--data.json_path={checkpoint.parent / 'data.json'}",
            "--data.val_split_fraction=0.1", "--data.num_workers=0",
            "--devices=1", "--train.max_steps=2", "--eval.interval=1000",
            "--eval.final_validation=false", f"--out_dir={folder / 'out'}",
        ],
        folder,
    )  # fmt: skip


# A full fine-tune on one GPU: no sharding, nothing checkpointed.
FULL = {**FULL_FSDP, "world_size": 1, "fsdp": "off", "checkpointing": False}


@pytest.mark.long  # about 10 s for each run on two cores
@pytest.mark.parametrize("change", [{}, FULL], ids=["lora", "full"])
def test_the_exported_command_trains_two_steps_on_cpu(
    workdir: Path,  # noqa: F811
    litgpt_facts: tuple[Path, dict[str, Any]],
    change: dict[str, Any],
) -> None:
    plan = TARGETS["litgpt"].run(_changed(change), workdir / "export")
    finetune = "finetune_full" if change else "finetune_lora"
    log = _two_steps(plan.files["config.yaml"], finetune, litgpt_facts[0], workdir)
    steps = [int(s) for s in re.findall(r"iter \d+ step (\d+)", log)]
    assert max(steps) == 2, log[-2000:]
    saved = "lit_model.pth" if change else "lit_model.pth.lora"
    assert (workdir / "out" / "final" / saved).is_file()
