"""`autofit export target=ai_toolkit`: its job files read by ai-toolkit's own config loader at
the pinned commit (issue 39 item 2), what it refuses, and what a search for it
(`trainer=ai_toolkit`) searches. The golden file is tests/test_export.py's (CASES).

ai-toolkit is not on PyPI and its loader runs only where a clone is (a `long` test). Without one
the same jobs are checked against the names ai-toolkit's source accepts, captured from the clone
at the pinned commit into tests/fixtures/export/ai_toolkit_27a03a91.json (tests/ai_toolkit_facts.py
reads them; a `long` test with a clone keeps the file equal to what the source says)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from ai_toolkit_env import COMMIT, facts, load, repository
from helpers import trainer_search
from test_export import FIXTURES, FLUX, REGENERATE, _all, point_for, workdir  # noqa: F401 (a fixture)

from autofit.export import TARGETS, write_export
from autofit.export.base import Refused
from autofit.export.defaults import table
from autofit.models import load_preset
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


FACTS = FIXTURES / f"ai_toolkit_{COMMIT[:8]}.json"
# The config class each section of the process is read into (BaseSDTrainProcess.__init__).
SECTION_CLASSES = {"network": "NetworkConfig", "train": "TrainConfig", "model": "ModelConfig",
                   "save": "SaveConfig", "sample": "SampleConfig"}  # fmt: skip


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
    chosen, _, _, runs = trainer_search("ai_toolkit", "flux_dev", "rtx4090")
    assert chosen is TARGETS["ai_toolkit"]
    assert any(why is None for _, why in runs)


def test_ai_toolkit_refuses_the_families_it_has_no_matched_model_for() -> None:
    from autofit.errors import ConfigError

    for model in ("wan2_1_t2v_1_3b", "llama3_2_1b", "sana_1600m"):
        with pytest.raises(ConfigError, match="trainer=ai_toolkit cannot train"):
            TARGETS["ai_toolkit"].check_family(load_preset(model), setting="trainer")


# --- the captured facts: every job checked without a clone ---------------------------------------


def optimizer_accepted(name: str, optimizers: dict[str, Any]) -> bool:
    """Whether get_optimizer builds an optimizer for train.optimizer: its chain of tests on the
    (lower-cased) name in order, the first that holds deciding, a rule with `then` only when one
    of its own holds."""

    def accepted(rules: list[dict[str, Any]]) -> bool:
        for rule in rules:
            ((test, value),) = [(k, v) for k, v in rule.items() if k != "then"]
            holds = {
                "equals": name == value,
                "startswith": name.startswith(value),
                "endswith": name.endswith(value),
            }[test]
            if holds:
                return "then" not in rule or accepted(rule["then"])
        return False

    name = name.lower() if optimizers["lowercased"] else name
    return accepted(optimizers["chain"])


def violations(job: dict[str, Any], known: dict[str, Any]) -> tuple[list[str], set[str]]:
    """What in an exported job ai-toolkit's source would ignore or reject, by the captured facts,
    and which of its enumerated fields the job sets (so a check is never vacuous)."""
    found: list[str] = []
    if job["job"] not in known["job_types"]:
        found.append(f"job: {job['job']}")
    (process,) = job["config"]["process"]
    if process["type"] != known["process_type"]:
        found.append(f"process type: {process['type']}")
    found += [
        f"process.{key}: no key it reads"
        for key in sorted(set(process) - set(known["process_keys"]))
    ]
    sections = [
        (name, process[name], cls) for name, cls in SECTION_CLASSES.items() if name in process
    ]
    sections += [
        (f"datasets[{i}]", raw, "DatasetConfig") for i, raw in enumerate(process["datasets"])
    ]
    train = process.get("train", {})
    if "ema_config" in train:
        sections.append(("train.ema_config", train["ema_config"], "EMAConfig"))
    for name, section, cls in sections:
        unread = sorted(set(section) - set(known["class_keys"][cls]))
        found += [f"{name}.{key}: {cls} reads no such key" for key in unread]
    arches, qtypes = known["arch"], known["qtypes"]
    enumerated = {
        "network.type": known["network_types"],
        "train.dtype": known["dtypes"],
        "save.dtype": known["dtypes"],
        "train.noise_scheduler": known["noise_schedulers"],
        "model.arch": arches["registered"] + arches["model_arch"],
        "model.qtype": qtypes["torchao"] + qtypes["ai_toolkit"] + qtypes["optimum_quanto"],
    }
    set_here = set()
    for dotted, accepted in enumerated.items():
        section, key = dotted.split(".")
        if key in process.get(section, {}):
            set_here.add(dotted)
            if process[section][key] not in accepted:
                found.append(f"{dotted}: {process[section][key]}")
    if "optimizer" in train:
        set_here.add("train.optimizer")
        if not optimizer_accepted(train["optimizer"], known["optimizers"]):
            found.append(f"train.optimizer: {train['optimizer']}")
    return found, set_here


def _jobs(workdir: Path) -> dict[str, dict[str, Any]]:  # noqa: F811
    """Every ai_toolkit job the tests export: the golden cases and the loader test's runs."""
    jobs = {out.name: out / "config.yaml" for out, _ in _all(workdir, "ai_toolkit")}
    jobs.update({name: _run(workdir, name)[1] for name in RUNS})
    return {name: yaml.safe_load(path.read_text()) for name, path in jobs.items()}


def test_ai_toolkit_jobs_use_only_names_its_source_accepts(workdir: Path) -> None:  # noqa: F811
    known = json.loads(FACTS.read_text())
    assert COMMIT in known["_source"]
    jobs = _jobs(workdir)
    assert len(jobs) == len(RUNS) + 1
    checked: set[str] = set()
    for name, job in jobs.items():
        found, set_here = violations(job, known)
        assert found == [], (name, found)
        checked |= set_here
    # every enumerated field was met by some job (qtype: the quantized Flux run)
    assert checked == {"network.type", "train.dtype", "save.dtype", "train.noise_scheduler",
                       "model.arch", "model.qtype", "train.optimizer"}  # fmt: skip


# One wrong key or value each: where in the process (a path of keys), and the line naming it.
WRONG = {
    "unknown_train_key": (("train",), "learning_rate", 1e-4, "train.learning_rate"),
    "unread_process_key": ((), "device", "cuda:0", "process.device"),
    "unknown_dataset_key": (("datasets", 0), "caption_extension", "txt", "datasets[0].caption_extension"),
    "unknown_ema_key": (("train", "ema_config"), "decay", 0.99, "train.ema_config.decay"),
    "8bit_name_it_lacks": (("train",), "optimizer", "paged_adamw8bit", "train.optimizer"),
    "unknown_optimizer": (("train",), "optimizer", "sgd", "train.optimizer"),
    "unknown_qtype": (("model",), "qtype", "fp8", "model.qtype"),
    "unknown_arch": (("model",), "arch", "flux1", "model.arch"),
    "unknown_dtype": (("train",), "dtype", "bfloat", "train.dtype"),
    "unknown_network": (("network",), "type", "dora", "network.type"),
    "unknown_scheduler": (("train",), "noise_scheduler", "flow_match", "train.noise_scheduler"),
    "another_process": ((), "type", "ui_trainer", "process type"),
}  # fmt: skip


@pytest.mark.parametrize("case", WRONG)
def test_the_facts_catch_a_wrong_key_or_value(workdir: Path, case: str) -> None:  # noqa: F811
    where, key, value, named = WRONG[case]
    (golden,) = (out / "config.yaml" for out, _ in _all(workdir, "ai_toolkit"))
    job = yaml.safe_load(golden.read_text())
    known = json.loads(FACTS.read_text())
    assert violations(job, known)[0] == []
    (section,) = job["config"]["process"]
    for step in where:
        section = section[step]
    section[key] = value
    found, _ = violations(job, known)
    assert [line for line in found if line.startswith(named)], (case, found)


@pytest.mark.parametrize(
    "name,accepted",
    [
        ("adamw8bit", True), ("AdamW8bit", True),  # lower-cased before it is matched
        ("lion8bit", True), ("adafactor", True), ("prodigy", True), ("dadaptation", True),
        ("DAdaptationLion", True),
        ("paged_adamw8bit", False),  # the 8bit branch names its four, else raises
        ("dadaptationsgd", False),  # the dadaptation branch builds none
        ("adamw 8bit", False), ("sgd", False),
    ],
)  # fmt: skip
def test_optimizer_names_are_matched_as_get_optimizer_matches_them(
    name: str, accepted: bool
) -> None:
    assert optimizer_accepted(name, json.loads(FACTS.read_text())["optimizers"]) is accepted


@pytest.mark.long  # builds ai-toolkit's source folder once, then imports its quantizers (~10 s)
@pytest.mark.skipif(repository() is None, reason=f"no clone of ostris/ai-toolkit at {COMMIT}")
def test_ai_toolkit_facts_follow_its_source() -> None:
    read = facts()
    if REGENERATE:
        FACTS.write_text(json.dumps(read, indent=1, sort_keys=True) + "\n")
    assert json.loads(FACTS.read_text()) == read
