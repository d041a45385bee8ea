"""`autofit export target=onetrainer`: its configs read by OneTrainer's own config loader at the
pinned commit (issue 39 item 2), what it refuses, and what a search for it (`trainer=onetrainer`)
searches. The golden files are tests/test_export.py's (CASES).

OneTrainer is not on PyPI and its loader runs only where a clone is (a `long` test). Without one
the same configs are checked against the names OneTrainer's source accepts, captured from the
clone at the pinned commit into tests/fixtures/export/onetrainer_23df3832.json
(tests/onetrainer_facts.py reads them; a `long` test with a clone keeps the file equal to what
the source says)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import trainer_search
from onetrainer_env import COMMIT, facts, load, repository
from test_export import FIXTURES, FLUX, REGENERATE, _all, point_for, workdir  # noqa: F401 (a fixture)

from autofit.errors import ConfigError
from autofit.export import TARGETS, write_export
from autofit.export.base import Refused
from autofit.export.defaults import table
from autofit.knobs.lora_targets import target_modules
from autofit.models import load_preset

# Runs of each family OneTrainer trains, from the fixed Flux study's best (LoRA, bf16,
# checkpointing, 8-bit AdamW, cached encoders) with the changes named.
RUNS = {
    "flux_fp8_online": ("flux_dev", {"base_precision": "fp8", "encoders": "online", "ema": "gpu",
                                     "optimizer": "adamw", "optimizer_impl": "fused"}),
    "flux_qlora_single_blocks": ("flux_dev", {"train_mode": "qlora", "lora_targets": "single_blocks",
                                              "optimizer": "paged_adamw8bit"}),
    "chroma_full_fused_pass": ("chroma", {"train_mode": "full", "precision": "bf16_autocast",
                                          "optimizer": "adafactor", "fused_backward": "parameter"}),
    "sdxl_lora_ema_cpu": ("sdxl", {"optimizer": "lion8bit", "ema": "cpu", "lora_targets": "attention"}),
    "sd21_fp32": ("sd21", {"precision": "fp32", "checkpointing": False, "optimizer": "adamw",
                           "optimizer_impl": "for_loop"}),
    "sd15_full_fp16": ("sd15", {"train_mode": "full", "precision": "fp16", "optimizer": "sgd"}),
}  # fmt: skip

FACTS = FIXTURES / f"onetrainer_{COMMIT[:8]}.json"


def _run(workdir: Path, name: str) -> tuple[dict, Path]:  # noqa: F811
    model, change = RUNS[name]
    best = point_for("onetrainer", FLUX, None)
    preset = load_preset(model)
    config = {**best.config, **change, "resolution": preset.resolution}
    loaded = dataclasses.replace(best, preset=preset, config=config)
    out = (workdir / "export" / name).resolve()
    write_export(TARGETS["onetrainer"].run(loaded, out))
    return config, out / "config.json"


def _flux_linear_names() -> list[str]:
    """The Linear modules of FLUX.1's transformer with one block of each kind (the names repeat
    per block), built on the meta device by diffusers."""
    import torch
    from diffusers import FluxTransformer2DModel

    architecture = {**load_preset("flux_dev").architecture, "num_layers": 1, "num_single_layers": 1}
    with torch.device("meta"):
        model = FluxTransformer2DModel(**architecture)
    return [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def _peft_selects(value: str, names: list[str]) -> list[str]:
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    config = LoraConfig(target_modules=target_modules(value, load_preset("flux_dev")))
    return [name for name in names if check_target_module_exists(config, name)]


@pytest.mark.long  # builds OneTrainer's source folder once (git archive), then ~10 s
@pytest.mark.skipif(repository() is None, reason=f"no clone of Nerogar/OneTrainer at {COMMIT}")
def test_onetrainer_configs_pass_onetrainers_own_config_loader(workdir: Path) -> None:  # noqa: F811
    assert COMMIT in table()["onetrainer"].checked_against
    runs = {name: _run(workdir, name) for name in RUNS}
    names = _flux_linear_names()
    # the layer filters of lora_targets=preset and single_blocks, as written
    filtered = {"preset": "flux_fp8_online", "single_blocks": "flux_qlora_single_blocks"}
    asked = []
    for run in filtered.values():
        written = json.loads(runs[run][1].read_text())
        asked.append({"layer_filter": written["layer_filter"],
                      "layer_filter_regex": written["layer_filter_regex"], "names": names})  # fmt: skip
    answer = load([str(path) for _, path in runs.values()], asked)
    read = dict(zip(runs, answer["configs"], strict=True))
    for name, loaded in read.items():
        config = runs[name][0]
        assert loaded["printed"] == "", (name, loaded["printed"])  # no value it could not set
        assert loaded["unread"] == [] and loaded["changed"] == [], (name, loaded)
        assert loaded["parts_not_of_model"] == [], (name, loaded["parts_not_of_model"])
        assert loaded["method_supported"] and loaded["format_supported"], name
        held = loaded["held"]
        assert held["batch_size"] == config["batch_size"]
        assert held["gradient_accumulation_steps"] == 1
        assert held["resolution"] == str(config["resolution"])
        assert held["latent_caching"] is (config["encoders"] == "cached")
        assert held["text_encoders_trained"] == []
        assert held["sample_after_unit"] == "NEVER" and held["concept_paths"] == ["path/to/images"]
        assert held["ema"] == config["ema"].upper()
        ((part, denoiser),) = held["denoiser"].items()
        assert denoiser["gradient_checkpointing"] is config["checkpointing"]
        assert denoiser["offload_fraction"] == 0.0
        if config["train_mode"] == "full":
            assert held["training_method"] == "FINE_TUNE"
        else:
            assert held["training_method"] == "LORA"
            assert held["lora_rank"] == held["lora_alpha"] == config["lora_rank"]
            assert held["layer_filter_regex"] is True
    flux = read["flux_fp8_online"]["held"]
    assert flux["model_type"] == "FLUX_DEV_1" and flux["train_dtype"] == "BFLOAT_16"
    assert flux["denoiser"]["transformer"]["weight_dtype"] == "FLOAT_8"
    assert flux["lora_weight_dtype"] == "FLOAT_32"  # fp32 adapters under bf16 autocast
    assert flux["optimizer"] == {"optimizer": "ADAMW", "fused": True, "foreach": False,
                                 "stochastic_rounding": False, "is_paged": False,
                                 "fused_back_pass": False, "weight_decay": 0.01}  # fmt: skip
    assert flux["learning_rate"] == 3e-4 and flux["epochs"] == 100  # its Flux LoRA preset's
    qlora = read["flux_qlora_single_blocks"]["held"]
    assert qlora["denoiser"]["transformer"]["weight_dtype"] == "NFLOAT_4"
    assert qlora["optimizer"]["optimizer"] == "ADAMW_8BIT" and qlora["optimizer"]["is_paged"]
    chroma = read["chroma_full_fused_pass"]["held"]
    assert chroma["model_type"] == "CHROMA_1" and chroma["training_method"] == "FINE_TUNE"
    assert chroma["denoiser"]["transformer"]["weight_dtype"] == "BFLOAT_16"  # bf16_autocast
    assert (
        chroma["optimizer"]["optimizer"] == "ADAFACTOR" and chroma["optimizer"]["fused_back_pass"]
    )
    assert chroma["learning_rate"] == 1e-5
    sdxl = read["sdxl_lora_ema_cpu"]["held"]
    assert sdxl["model_type"] == "STABLE_DIFFUSION_XL_10_BASE" and "unet" in sdxl["denoiser"]
    assert sdxl["optimizer_name"] == "LION_8BIT"
    sd21 = read["sd21_fp32"]["held"]
    assert sd21["model_type"] == "STABLE_DIFFUSION_21" and sd21["train_dtype"] == "FLOAT_32"
    assert sd21["denoiser"]["unet"]["weight_dtype"] == "FLOAT_32"
    assert sd21["optimizer"]["fused"] is False and sd21["optimizer"]["foreach"] is False
    sd15 = read["sd15_full_fp16"]["held"]
    assert sd15["model_type"] == "STABLE_DIFFUSION_15" and sd15["train_dtype"] == "FLOAT_16"
    assert sd15["denoiser"]["unet"]["weight_dtype"] == "FLOAT_32"  # fp32 masters, loss scaled
    assert sd15["learning_rate"] == 3e-6  # its TrainConfig's own: the presets set none
    # OneTrainer's ModuleFilter selects what peft's target_modules select
    for value, chosen in zip(filtered, answer["filters"], strict=True):
        assert chosen and chosen == _peft_selects(value, names), value


def test_onetrainer_refuses_what_it_does_not_run_as_measured(workdir: Path) -> None:  # noqa: F811
    loaded = point_for("onetrainer", FLUX, None)
    for change, knob in (
        ({"precision": "bf16_pure"}, "precision"),  # it autocasts a 16-bit train_dtype
        ({"train_mode": "dora"}, "train_mode"),
        ({"base_precision": "fp8_quanto"}, "base_precision"),
        ({"encoders": "text"}, "encoders"),
        ({"encoders": "online", "t5_precision": "fp8_quanto"}, "t5_precision"),
        ({"swap_blocks": 8}, "swap_blocks"),
        ({"offload_activations": "cpu"}, "offload_activations"),
        ({"optimizer": "came"}, "optimizer"),
        ({"optimizer": "adamw", "fused_backward": "parameter"}, "fused_backward"),  # fused AdamW
        ({"fused_backward": "parameter"}, "fused_backward"),  # 8-bit AdamW
        ({"compile": "regional"}, "compile"),
        ({"validation": "on"}, "validation"),
        ({"world_size": 2}, "world_size"),
    ):
        changed = dataclasses.replace(loaded, config={**loaded.config, **change})
        with pytest.raises(Refused) as refused:
            TARGETS["onetrainer"].run(changed, workdir / "out")
        assert refused.value.knob == knob, str(refused.value)
        assert "\n" not in str(refused.value) and "onetrainer offers" in str(refused.value)
    sdxl = dataclasses.replace(loaded, preset=load_preset("sdxl"))
    changed = dataclasses.replace(sdxl, config={**loaded.config, "base_precision": "fp8"})
    with pytest.raises(Refused, match="keeps the UNet's convolutions in 16 bits"):
        TARGETS["onetrainer"].run(changed, workdir / "out")


def test_the_launch_line_sets_the_allocator_autofit_measured(workdir: Path) -> None:  # noqa: F811
    loaded = point_for("onetrainer", FLUX, None)
    plan = TARGETS["onetrainer"].run(loaded, workdir / "out")
    assert plan.command.startswith("python scripts/train.py --config-path ")
    assert any("run-cmd.sh" in note for note in plan.notes)
    changed = dataclasses.replace(
        loaded, config={**loaded.config, "allocator": "expandable_segments"}
    )
    plan = TARGETS["onetrainer"].run(changed, workdir / "out")
    assert plan.command.startswith("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python ")


def test_a_search_for_onetrainer_searches_only_what_it_launches() -> None:
    chosen, _, _, runs = trainer_search("onetrainer", "flux_dev", "rtx4090")
    assert chosen is TARGETS["onetrainer"]
    assert any(why is None for _, why in runs)


def test_onetrainer_refuses_the_families_it_has_no_matched_model_for() -> None:
    for model in ("wan2_1_t2v_1_3b", "llama3_2_1b", "sana_1600m", "sd35_large"):
        with pytest.raises(ConfigError, match="trainer=onetrainer cannot train"):
            TARGETS["onetrainer"].check_family(load_preset(model), setting="trainer")


# --- the captured facts: every config checked without a clone ---------------------------------


def _fields(value: dict[str, Any], cls: str, known: dict[str, Any], where: str) -> list[str]:
    """What of `value`, read into the config class `cls`, OneTrainer would not set as written."""
    found: list[str] = []
    fields = known["classes"][cls]
    for key, item in value.items():
        name = f"{where}{key}"
        if key == "__version":
            continue
        if key not in fields:
            found.append(f"{name}: {cls} reads no such key")
            continue
        kind = fields[key]
        if kind.startswith("config:"):
            if not isinstance(item, dict):
                found.append(f"{name}: not a {kind[7:]}")
            else:
                found += _fields(item, kind[7:], known, f"{name}.")
        elif kind.startswith("enum:"):
            if item not in known["enums"][kind[5:]]:
                found.append(f"{name}: {item!r} is no {kind[5:]}")
        elif kind in ("bool", "int", "float", "str"):
            types = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,)}[kind]
            if not isinstance(item, types) or (kind != "bool" and isinstance(item, bool)):
                found.append(f"{name}: {item!r} is no {kind}")
    return found


def violations(config: dict[str, Any], concepts: list[Any], known: dict[str, Any]) -> list[str]:
    """What in an exported config and its concepts OneTrainer's source would ignore, fail to set
    or reject, by the captured facts."""
    found = []
    if config.get("__version") != known["config_version"]:
        found.append(f"__version: {config.get('__version')} (its migrations would run)")
    found += _fields(config, "TrainConfig", known, "")
    model = known["model_types"].get(config.get("model_type"))
    if model is not None:
        parts = known["classes"]["TrainConfig"]
        written = [k for k in config if parts.get(k) == "config:TrainModelPartConfig"]
        found += [
            f"{p}: no part of {config['model_type']}" for p in written if p not in model["parts"]
        ]
        method = config.get("training_method")
        if method not in model["training_methods"]:
            found.append(f"training_method: {method} is not one of {config['model_type']}'s")
        elif config.get("output_model_format") not in model["output_formats"].get(method, []):
            found.append(f"output_model_format: {config.get('output_model_format')} for {method}")
    for i, concept in enumerate(concepts):
        if concept.get("__version") != known["concept_version"]:
            found.append(f"concepts[{i}].__version: {concept.get('__version')}")
        found += _fields(concept, "ConceptConfig", known, f"concepts[{i}].")
    return found


def _configs(workdir: Path) -> dict[str, tuple[dict[str, Any], list[Any]]]:  # noqa: F811
    """Every onetrainer config the tests export (the golden cases and the loader test's runs),
    with its concepts."""
    paths = {out.name: out / "config.json" for out, _ in _all(workdir, "onetrainer")}
    paths.update({name: _run(workdir, name)[1] for name in RUNS})
    read = {}
    for name, path in paths.items():
        config = json.loads(path.read_text())
        read[name] = (config, json.loads(Path(config["concept_file_name"]).read_text()))
    return read


def test_onetrainer_configs_use_only_names_its_source_accepts(workdir: Path) -> None:  # noqa: F811
    known = json.loads(FACTS.read_text())
    assert COMMIT in known["_source"]
    configs = _configs(workdir)
    assert len(configs) == len(RUNS) + 1
    for name, (config, concepts) in configs.items():
        assert violations(config, concepts, known) == [], name


# One wrong key or value each: where in the config (a path of keys), and the line naming it.
WRONG = {
    "unknown_key": ((), "learning_rate_warmup", 100, "learning_rate_warmup: TrainConfig"),
    "key_of_another_version": ((), "gradient_checkpointing", "ON", "gradient_checkpointing: TrainConfig"),
    "unknown_part_key": (("transformer",), "layer_offload_fraction", 0.5, "transformer.layer_offload_fraction"),
    "unknown_optimizer_key": (("optimizer",), "paged", True, "optimizer.paged"),
    "unknown_optimizer": (("optimizer",), "optimizer", "PAGED_ADAMW_8BIT", "optimizer.optimizer"),
    "unknown_dtype": (("transformer",), "weight_dtype", "FP8", "transformer.weight_dtype"),
    "unknown_model_type": ((), "model_type", "FLUX_1_DEV", "model_type"),
    "unknown_method": ((), "training_method", "QLORA", "training_method"),
    "part_the_model_lacks": ((), "unet", {"train": True}, "unet: no part"),
    "format_for_another_method": ((), "output_model_format", "DIFFUSERS", "output_model_format"),
    "string_for_a_bool": ((), "latent_caching", "true", "latent_caching"),
    "older_version": ((), "__version", 10, "__version"),
    "unknown_concept_key": (("concepts", 0), "repeats", 2, "concepts[0].repeats"),
}  # fmt: skip


@pytest.mark.parametrize("case", WRONG)
def test_the_facts_catch_a_wrong_key_or_value(workdir: Path, case: str) -> None:  # noqa: F811
    where, key, value, named = WRONG[case]
    (golden,) = (out / "config.json" for out, _ in _all(workdir, "onetrainer"))
    config = json.loads(golden.read_text())
    concepts = json.loads(Path(config["concept_file_name"]).read_text())
    known = json.loads(FACTS.read_text())
    assert violations(config, concepts, known) == []
    section: Any = {"concepts": concepts, **config} if where[:1] == ("concepts",) else config
    for step in where:
        section = section[step]
    section[key] = value
    found = violations(config, concepts, known)
    assert [line for line in found if line.startswith(named)], (case, found)


@pytest.mark.long  # builds OneTrainer's source folder once, then imports its config classes (~5 s)
@pytest.mark.skipif(repository() is None, reason=f"no clone of Nerogar/OneTrainer at {COMMIT}")
def test_onetrainer_facts_follow_its_source() -> None:
    read = facts()
    if REGENERATE:
        FACTS.write_text(json.dumps(read, indent=1, sort_keys=True) + "\n")
    assert json.loads(FACTS.read_text()) == read
