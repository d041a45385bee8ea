"""`model=path/to/config.json`, a folder holding one, or `model=hf:org/name` from the local
Hugging Face cache: any causal language model transformers has, built from its config with
random weights, nothing downloaded; the same allocations on fake tensors as on real ones; each
mistake one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import assert_same_allocations, autofit, in_process

from autofit.backends import cpu, simulate
from autofit.errors import ConfigError
from autofit.gpus import load_gpu
from autofit.model_files import preset_entry
from autofit.models import ModelPreset, load_preset
from autofit.probe.build import make_spec

SMALL = {
    "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048,
    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip
# Architectures the shipped presets do not have, each as save_pretrained writes its config.
CONFIGS = {
    "mistral": {"model_type": "mistral", "architectures": ["MistralForCausalLM"]},
    "phi3": {"model_type": "phi3"},  # fused qkv_proj and gate_up_proj
    "gemma2": {"model_type": "gemma2", "head_dim": 16},  # no SDPA: its eager attention
    "gemma3_text": {"model_type": "gemma3_text", "head_dim": 16},
}
MOE = {
    "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2,
}  # fmt: skip
# DeepSeek-V3's layout: multi-head latent attention (low-rank query and key-value projections),
# a dense first block, then routed experts beside a shared one.
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3", "moe_intermediate_size": 32, "first_k_dense_replace": 1,
    "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2,
    "topk_group": 1, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8, "v_head_dim": 16, "num_key_value_heads": 4,
}  # fmt: skip
# Its latent attention alone (every block dense): real routing is data-dependent, so only a
# model without routed experts can be held to fake-equals-real.
CONFIGS["deepseek_v3_mla"] = {**DEEPSEEK_V3, "first_k_dense_replace": SMALL["num_hidden_layers"]}


def _folder(root: Path, name: str, fields: dict[str, Any]) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    config = {**SMALL, **fields, "torch_dtype": "bfloat16", "transformers_version": "5.0.0"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("train_mode", ["full", "lora"])
def test_a_config_file_builds_the_same_allocations_on_fake_tensors_as_on_real_ones(
    name: str, train_mode: str, tmp_path: Path
) -> None:
    entry = preset_entry(str(_folder(tmp_path, name, CONFIGS[name])))
    assert entry["family"] == "llm" and entry["blocks"] == ["model.layers"]
    assert entry["max_swap_blocks"] == 0 and entry["resolution"] == 2048
    preset = ModelPreset.from_dict(entry)
    knobs = {"batch_size": 2, "resolution": 32, "train_mode": train_mode}
    spec = make_spec(preset, load_gpu("a40"), knobs, backend="simulate", timeout_s=300)
    fake_run, fake = simulate.trace(spec)
    real_run, real = cpu.trace(spec)
    assert fake.sizes == real.sizes
    assert fake.peak_report() == real.peak_report()
    assert fake_run.trainable_param_count == real_run.trainable_param_count > 0


def test_lora_adapts_every_linear_layer_the_config_s_blocks_have(tmp_path: Path) -> None:
    """As PEFT's all-linear: Phi-3's fused projections, a mixture's attention (its experts are
    fused 3-D parameters, not linear layers)."""
    phi3 = preset_entry(str(_folder(tmp_path, "phi3", CONFIGS["phi3"])))
    assert phi3["lora_targets"] == ["down_proj", "gate_up_proj", "o_proj", "qkv_proj"]
    mixtral = preset_entry(str(_folder(tmp_path, "mixtral", MOE)))
    assert mixtral["lora_targets"] == ["k_proj", "o_proj", "q_proj", "v_proj"]
    spec = make_spec(
        ModelPreset.from_dict(mixtral), load_gpu("a40"), {"batch_size": 2, "resolution": 32},
        backend="simulate", timeout_s=300,
    )  # fmt: skip
    _, fake = simulate.trace(spec)  # the experts through the grouped-GEMM stand-in
    assert fake.peak > 0


@pytest.mark.parametrize("train_mode", ["full", "lora"])
def test_a_deepseek_v3_config_adapts_its_latent_attention_and_dense_blocks(
    train_mode: str, tmp_path: Path
) -> None:
    """LoRA's targets are the linear layers its blocks have: the latent attention's low-rank
    projections and the dense and shared-expert MLPs (the routed experts are fused 3-D
    parameters); the model traces on fake tensors, its experts through the grouped-GEMM
    stand-in."""
    entry = preset_entry(str(_folder(tmp_path, "dsv3", DEEPSEEK_V3)))
    assert entry["family"] == "llm" and entry["blocks"] == ["model.layers"]
    assert entry["lora_targets"] == [
        "down_proj", "gate_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "q_a_proj",
        "q_b_proj", "up_proj",
    ]  # fmt: skip
    spec = make_spec(
        ModelPreset.from_dict(entry), load_gpu("a40"),
        {"batch_size": 2, "resolution": 32, "train_mode": train_mode},
        backend="simulate", timeout_s=300,
    )  # fmt: skip
    run, fake = simulate.trace(spec)
    assert fake.peak > 0 and run.trainable_param_count > 0


def _cache(root: Path, repo: str, config: dict[str, Any]) -> Path:
    """A Hugging Face cache holding `repo`'s config as huggingface_hub lays one out."""
    folder = root / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("abc123")
    snapshot = folder / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({**SMALL, **config}))
    return root


def test_a_probe_runs_from_a_folder_and_from_the_local_hugging_face_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _folder(tmp_path, "my-mistral", CONFIGS["mistral"])
    done = in_process(
        "probe", "model=my-mistral", "gpu=a40", "batch_size=2", "resolution=64", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("my_mistral on a40 [")
    monkeypatch.setenv(
        "HF_HUB_CACHE", str(_cache(tmp_path / "hub", "org/tiny-phi", CONFIGS["phi3"]))
    )
    cached = in_process(
        "probe", "model=hf:org/tiny-phi", "gpu=a40", "train_mode=lora", "resolution=64",
        cwd=tmp_path,
    )  # fmt: skip
    assert cached.returncode == 0, cached.stderr
    assert cached.stdout.startswith("tiny_phi on a40 [")


@pytest.mark.long
def test_a_search_from_a_config_file_prints_commands_naming_the_file(tmp_path: Path) -> None:
    """In a fresh interpreter, as a user runs it: the search answers, and the command it prints
    to run it again names the config as given (not the name it was stored under)."""
    _folder(tmp_path, "cfg", CONFIGS["mistral"])
    space = tmp_path / "tiny.yaml"
    space.write_text("batch_size: {min: 1, max: 4}\nresolution: [x1]\nknobs: {}\n")
    done = autofit("search", "model=cfg", "gpu=a40", f"space={space}", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (folder,) = (tmp_path / "results").glob("cfg-a40-*")
    summary = json.loads((folder / "summary.json").read_text())
    assert "model=cfg" in summary["rerun"] and "file-" not in summary["rerun"]


# A Wan transformer as a diffusers pipeline folder holds it (transformer/config.json), at a width
# a CPU steps in a second; its text width is the template's (umT5-XXL's 4096).
WAN_CONFIG = {
    "_class_name": "WanTransformer3DModel", "_diffusers_version": "0.33.0", "patch_size": [1, 2, 2],
    "num_attention_heads": 2, "attention_head_dim": 16, "in_channels": 16, "out_channels": 16,
    "text_dim": 4096, "freq_dim": 32, "ffn_dim": 64, "num_layers": 3, "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads", "eps": 1e-06, "image_dim": None, "added_kv_proj_dim": None,
    "rope_max_seq_len": 1024,
}  # fmt: skip


def test_a_diffusers_config_builds_a_model_of_the_family_that_declares_its_class(
    tmp_path: Path,
) -> None:
    pipeline = tmp_path / "Wan-Tiny-Diffusers"
    (pipeline / "transformer").mkdir(parents=True)
    (pipeline / "model_index.json").write_text("{}")
    (pipeline / "transformer" / "config.json").write_text(json.dumps(WAN_CONFIG))
    entry = preset_entry(str(pipeline))
    preset = ModelPreset.from_dict(entry)
    assert (preset.family, preset.name, preset.architecture["num_layers"]) == (
        "wan", "wan_tiny_diffusers", 3,
    )  # fmt: skip
    assert "_class_name" not in preset.architecture and "image_dim" not in preset.architecture
    assert preset.inputs == load_preset("wan2_1_t2v_1_3b").inputs  # its family's template's
    assert preset.max_swap_blocks == 2  # the template keeps one block on the GPU; so does it
    knobs = {"batch_size": 1, "resolution": 64, "frames": 5, "train_mode": "lora"}
    probe = make_spec(preset, load_gpu("rtx4090"), knobs, backend="simulate")
    _, fake = simulate.trace(probe)
    _, real = cpu.trace(make_spec(preset, load_gpu("rtx4090"), knobs, backend="cpu"))
    assert_same_allocations(fake, real)


def _refusal(tmp_path: Path, *args: str) -> str:
    done = in_process("probe", *args, "gpu=a40", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_each_mistake_is_one_line_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    line = _refusal(tmp_path, "model=hf:org/absent")
    assert "not in the local Hugging Face cache" in line
    assert str(tmp_path / "empty-cache" / "models--org--absent") in line
    assert "hf download org/absent config.json" in line
    assert "no such file" in _refusal(tmp_path, "model=nothere.json")
    unet = tmp_path / "unet"
    unet.mkdir()
    (unet / "config.json").write_text('{"_class_name": "UNet2DConditionModel"}')
    line = _refusal(tmp_path, "model=unet")
    assert "a diffusers UNet2DConditionModel config, which no family of autofit's builds" in line
    assert "WanTransformer3DModel (wan)" in line
    odd = _folder(tmp_path, "odd", {"model_type": "not_a_model"})
    assert "'not_a_model' is not a causal language model" in _refusal(tmp_path, f"model={odd}")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert "is not a JSON file" in _refusal(tmp_path, f"model={broken}")
    with pytest.raises(ConfigError, match="write model=hf:org/name"):
        preset_entry("hf:no-slash")
