"""`autofit export target=ai_toolkit`: its job files read by ai-toolkit's own config loader at
the pinned commit (issue 39 item 2), what it refuses, and what a search for it
(`trainer=ai_toolkit`) searches. The golden file is tests/test_export.py's (CASES)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from ai_toolkit_env import COMMIT, load, repository
from test_export import FLUX, point_for, workdir  # noqa: F401 (a fixture)

from autofit.commands.search import _for_trainer
from autofit.export import TARGETS, unlaunchable, write_export
from autofit.export.base import Refused
from autofit.export.defaults import table
from autofit.gpus import load_gpu
from autofit.knobs import defaults, invalid_reason
from autofit.models import load_preset
from autofit.search.space import load_space
from autofit.techniques.quanto_excluded import QUANTO_EXCLUDED

# Runs of each family ai-toolkit trains, from the fixed Flux study's best (LoRA, bf16,
# checkpointing, 8-bit AdamW, cached encoders) with the changes named.
RUNS = {
    "flux_fp8_text": ("flux_dev", {"base_precision": "fp8_quanto", "encoders": "text",
                                   "t5_precision": "fp8_quanto", "optimizer": "adamw"}),
    "schnell_single_blocks": ("flux_schnell", {"lora_targets": "single_blocks", "ema": "gpu"}),
    "chroma_all_linear": ("chroma", {"lora_targets": "all_linear", "optimizer": "adafactor"}),
    "sdxl_lora_online": ("sdxl", {"encoders": "online", "optimizer": "lion8bit"}),
    "sd21_full": ("sd21", {"train_mode": "full", "precision": "bf16_pure"}),
    "sd15_fp32": ("sd15", {"precision": "fp32", "checkpointing": False,
                           "optimizer_impl": "foreach", "optimizer": "adamw"}),
}  # fmt: skip


def _run(workdir: Path, name: str) -> tuple[dict, Path]:  # noqa: F811
    model, change = RUNS[name]
    best = point_for("ai_toolkit", FLUX, None)
    preset = load_preset(model)
    config = {**best.config, **change, "resolution": preset.resolution}
    loaded = dataclasses.replace(best, preset=preset, config=config)
    out = (workdir / "export" / name).resolve()
    write_export(TARGETS["ai_toolkit"].run(loaded, out))
    return config, out / "config.yaml"


@pytest.mark.long  # builds ai-toolkit's source folder once (git archive, pip of av), then ~15 s
@pytest.mark.skipif(repository() is None, reason=f"no clone of ostris/ai-toolkit at {COMMIT}")
def test_ai_toolkit_jobs_pass_ai_toolkits_own_config_loader(workdir: Path) -> None:  # noqa: F811
    assert COMMIT in table()["ai_toolkit"].checked_against
    runs = {name: _run(workdir, name) for name in RUNS}
    read = dict(zip(runs, load([str(path) for _, path in runs.values()]), strict=True))
    for name, held in read.items():
        config = runs[name][0]
        assert held["unread"] == {}, (name, held["unread"])  # every key written is one it reads
        train, network = held["train"], held["network"]
        assert train["batch_size"] == config["batch_size"]
        assert train["gradient_accumulation"] == 1
        assert train["gradient_checkpointing"] is config["checkpointing"]
        assert train["disable_sampling"] is True and train["use_ema"] is (config["ema"] == "gpu")
        assert [d["resolution"] for d in held["datasets"]] == [config["resolution"]]
        cached = config["encoders"] == "cached"
        assert all(d["cache_text_embeddings"] is cached for d in held["datasets"])
        assert all(
            d["cache_latents_to_disk"] is (config["encoders"] != "online") for d in held["datasets"]
        )
        if config["train_mode"] == "lora":
            assert network["type"] == "lora"
            assert network["linear"] == network["linear_alpha"] == config["lora_rank"]
        else:
            assert network is None and train["train_unet"] and not train["train_text_encoder"]
    flux = read["flux_fp8_text"]
    assert flux["model"]["arch"] == "flux" and flux["model"]["is_flux"]
    assert flux["model"]["quantize"] and flux["model"]["qtype"] == "qfloat8"
    assert flux["model"]["quantize_te"] is True  # T5 on the GPU in qfloat8, as measured
    assert flux["model"]["quantize_kwargs"] == {"exclude": list(QUANTO_EXCLUDED["flux"])}
    assert flux["train"]["optimizer"] == "torch.optim.adamw.AdamW"
    assert flux["train"]["optimizer_defaults"]["fused"] is True  # optimizer_impl=fused
    assert flux["train"]["dtype"] == "bf16" and flux["train"]["noise_scheduler"] == "flowmatch"
    assert flux["network"]["network_kwargs"]["only_if_contains"] == list(
        load_preset("flux_dev").lora_targets
    )
    schnell = read["schnell_single_blocks"]
    assert schnell["model"]["assistant_lora_path"]  # ai-toolkit's schnell training adapter
    assert schnell["network"]["network_kwargs"] == {
        "only_if_contains": ["single_transformer_blocks"]
    }
    assert schnell["model"]["quantize"] is False and schnell["train"]["use_ema"] is True
    chroma = read["chroma_all_linear"]
    assert chroma["model"]["arch"] == "chroma" and chroma["network"]["network_kwargs"] == {}
    assert chroma["train"]["optimizer"] == "toolkit.optimizers.adafactor.Adafactor"
    sdxl = read["sdxl_lora_online"]
    assert sdxl["model"]["arch"] == "sdxl" and sdxl["model"]["is_xl"]
    assert sdxl["train"]["optimizer"] == "bitsandbytes.optim.lion.Lion8bit"
    sd21 = read["sd21_full"]
    assert sd21["model"]["arch"] == "sd2" and sd21["model"]["is_v2"] and sd21["model"]["is_v_pred"]
    assert sd21["train"]["dtype"] == "bf16" and sd21["train"]["lr"] == 1e-6  # its own default
    sd15 = read["sd15_fp32"]
    assert sd15["model"]["arch"] == "sd1" and sd15["train"]["dtype"] == "fp32"
    # optimizer_impl=foreach: AdamW told nothing, torch's default on a GPU (None on both)
    assert {"fused", "foreach"}.isdisjoint(sd15["train"]["optimizer_defaults"])


def test_ai_toolkit_refuses_what_it_does_not_run_as_measured(workdir: Path) -> None:  # noqa: F811
    loaded = point_for("ai_toolkit", FLUX, None)
    for change, knob in (
        ({"checkpointing": False}, "precision"),  # fp32 input copies kept by every block
        ({"precision": "bf16_pure"}, "precision"),  # its LoRA weights are fp32
        ({"precision": "fp16"}, "precision"),  # no loss scaling
        ({"train_mode": "full"}, "precision"),  # bf16 with fp32 masters: not its full fine-tune
        ({"train_mode": "qlora"}, "train_mode"),
        ({"base_precision": "fp8"}, "base_precision"),
        ({"encoders": "text", "base_precision": "int8_quanto", "t5_precision": "fp8_quanto"},
         "t5_precision"),
        ({"optimizer": "paged_adamw8bit"}, "optimizer"),
        ({"ema": "cpu"}, "ema"),
        ({"validation": "on"}, "validation"),
        ({"swap_blocks": 8}, "swap_blocks"),
        ({"world_size": 2}, "world_size"),
    ):  # fmt: skip
        changed = dataclasses.replace(loaded, config={**loaded.config, **change})
        with pytest.raises(Refused) as refused:
            TARGETS["ai_toolkit"].run(changed, workdir / "out")
        assert refused.value.knob == knob, str(refused.value)
        assert "\n" not in str(refused.value) and "ai_toolkit offers" in str(refused.value)
    sdxl = dataclasses.replace(loaded, preset=load_preset("sdxl"))
    changed = dataclasses.replace(sdxl, config={**loaded.config, "base_precision": "fp8_quanto"})
    with pytest.raises(Refused, match="quantizes transformer models only"):
        TARGETS["ai_toolkit"].run(changed, workdir / "out")


def test_a_search_for_ai_toolkit_searches_only_what_it_launches() -> None:
    preset, gpu = load_preset("flux_dev"), load_gpu("rtx4090")
    chosen, stack, values, space = _for_trainer("ai_toolkit", preset, load_space("quick", preset))
    assert chosen is TARGETS["ai_toolkit"]
    searched = 0
    for combination in space.combinations():
        knobs = {**defaults(), **combination, "resolution": space.resolutions[0]}
        if invalid_reason(knobs, gpu, preset, "simulate") is None:
            if unlaunchable(chosen, preset, knobs) is None:
                searched += 1
    assert searched


def test_ai_toolkit_refuses_the_families_it_has_no_matched_model_for() -> None:
    from autofit.errors import ConfigError

    for model in ("wan2_1_t2v_1_3b", "llama3_2_1b", "sana_1600m"):
        with pytest.raises(ConfigError, match="trainer=ai_toolkit cannot train"):
            TARGETS["ai_toolkit"].check_family(load_preset(model), setting="trainer")
