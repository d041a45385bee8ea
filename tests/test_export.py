"""`autofit export`: golden files for every target on fixed study results, each output checked by
the target's own parser (or, where it cannot be installed here, its captured option list), the
rules each trainer imposes, and every kind of bad input as one line.

Regenerate the golden files after an intended change with
`AUTOFIT_REGENERATE_GOLDEN=1 pytest tests/test_export.py` and review the diff.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import presets_by_family

from autofit.cli import main
from autofit.errors import AutofitError, ConfigError
from autofit.export import TARGETS, load_point, write_export
from autofit.export.base import Refused
from autofit.export.defaults import MARK, Row, mode_of, table
from autofit.families import kohya_max_blocks_to_swap
from autofit.knobs import REGISTRY, Refuse, Subject
from autofit.knobs import defaults as knob_defaults
from autofit.models import ModelPreset, load_preset
from autofit.paths import group_options

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures" / "export"
GOLDEN = HERE / "golden" / "export"
REGENERATE = os.environ.get("AUTOFIT_REGENERATE_GOLDEN") == "1"
WORKDIR = "/WORKDIR"  # the test's temporary folder, in golden files

SANA = "sana_1600m-a40-default"
FLUX = "flux_dev-rtx4090-default"
LLAMA = "llama3_2_1b-a40-offload"  # QLoRA under ZeRO-3 with NVMe and activation offload
TRL_SEARCH = "llama3_2_1b-rtx4090-quick-trl"  # `autofit search ... space=quick trainer=trl`
TORCHTUNE_SEARCH = "llama3_2_1b-rtx4090-quick-torchtune"  # the same search, trainer=torchtune
# `autofit search model=llama3_8b gpu=a100_80 space=quick trainer=litgpt` (LitGPT unties Llama
# 3.2's head, so it trains none of the 1B and 3B presets)
LITGPT_SEARCH = "llama3_8b-a100_80-quick-litgpt"
# `autofit search model=llama3_2_3b gpu=a100_80 space=<its space.yaml> trainer=axolotl`: a full
# fine-tune over two GPUs under FSDP2 (shard_grad_op), bf16 weights, checkpointing; Llama 3.2's
# tied head is what axolotl's and LLaMA-Factory's FSDP2 shard as measured (an untied 8B's is not).
FSDP_SEARCH = "llama3_2_3b-a100_80-fsdp-axolotl"
WAN = "wan2_1_t2v_1_3b-rtx4090-quick"  # Wan 2.1 1.3B: LoRA, 81 frames at 480x832
HUNYUAN = "hunyuan_video-rtx4090-small_cards_lora"  # fp8 base, 18 blocks swapped, 33 frames
# (target, study, Pareto point or None for the best, target.global_batch, golden case)
CASES = [
    ("accelerate", SANA, None, None, "sana_best"),
    ("accelerate", SANA, 6, 96, "sana_zero2_offload"),
    ("deepspeed", SANA, None, None, "sana_best"),
    ("deepspeed", SANA, 6, 96, "sana_zero2_offload"),
    ("deepspeed", LLAMA, None, 16, "llama_qlora_zero3_nvme"),
    ("accelerate", LLAMA, None, 16, "llama_qlora_zero3_nvme"),
    ("simpletuner", SANA, None, None, "sana_best"),
    ("simpletuner", SANA, 5, None, "sana_8bit_ema_validation"),
    ("simpletuner", SANA, 6, None, "sana_zero2_offload"),
    ("kohya", FLUX, None, 4, "flux_lora"),
    ("kohya", FLUX, 3, None, "flux_full_swap"),
    ("sana", SANA, 7, 128, "sana_came_online"),
    ("diffusers", SANA, 4, None, "sana_lora"),
    ("diffusers", FLUX, None, None, "flux_lora"),
    ("trl", TRL_SEARCH, None, None, "llama_lora"),
    ("trl", TRL_SEARCH, 2, 8, "llama_lora_checkpointing"),
    ("trl", LLAMA, None, 16, "llama_qlora_zero3_nvme"),
    ("axolotl", TRL_SEARCH, None, None, "llama_lora"),
    ("axolotl", TRL_SEARCH, 2, 8, "llama_lora_checkpointing"),
    ("axolotl", LLAMA, None, 16, "llama_qlora_zero3_nvme"),
    ("axolotl", FSDP_SEARCH, None, None, "llama3b_full_fsdp"),
    ("torchtune", TORCHTUNE_SEARCH, None, None, "llama_lora"),
    ("torchtune", TORCHTUNE_SEARCH, 2, 10, "llama_lora_checkpointing"),
    ("litgpt", LITGPT_SEARCH, None, None, "llama_lora"),
    ("llamafactory", TRL_SEARCH, None, None, "llama_lora"),
    ("llamafactory", TRL_SEARCH, 2, 8, "llama_lora_checkpointing"),
    ("llamafactory", LLAMA, None, 16, "llama_qlora_zero3_nvme"),
    ("llamafactory", FSDP_SEARCH, None, None, "llama3b_full_fsdp"),
    ("musubi", WAN, None, None, "wan_1_3b_lora"),
    ("musubi", WAN, 1, None, "wan_1_3b_lora_33_frames"),
    ("musubi", HUNYUAN, None, None, "hunyuan_video_fp8_swap"),
    ("ai_toolkit", FLUX, None, 4, "flux_lora"),
    ("onetrainer", FLUX, None, 4, "flux_lora"),
    ("hydra", SANA, None, None, "sana_best"),
    ("hydra", FLUX, 4, None, "flux_qlora"),
]


def _preset(name: str) -> ModelPreset:
    """Test stand-ins (tests/fixtures/export/<name>.yaml) first, then the shipped presets."""
    path = FIXTURES / f"{name}.yaml"
    if path.exists():
        return ModelPreset.from_dict(yaml.safe_load(path.read_text()))
    return load_preset(name)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with the fixed studies under results/, as `autofit search` leaves them."""
    for study in (SANA, FLUX):
        (tmp_path / "results" / study).mkdir(parents=True)
        shutil.copy(FIXTURES / study / "summary.json", tmp_path / "results" / study)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("autofit.export.point.load_preset", _preset)
    return tmp_path


# SimpleTuner and sd-scripts run bf16 weights under accelerate's bf16 autocast: exported to them,
# the fixture's bf16_pure best run stands for that run.
AUTOCASTING = ("simpletuner", "kohya")


def _summary(study: str) -> Path:
    """A study's summary under results/; LLAMA's is copied there only where a case asks for it
    (the tests of the `export` command see the two fixed studies)."""
    path = Path("results") / study / "summary.json"
    if not path.exists():
        path.parent.mkdir(parents=True)
        shutil.copy(FIXTURES / study / "summary.json", path)
    return path


def point_for(target: str, study: str, point: int | None, batch: int | None = None) -> Any:
    loaded = load_point(_summary(study), point, batch)
    if target in AUTOCASTING and loaded.config["precision"] == "bf16_pure":
        loaded = dataclasses.replace(loaded, config={**loaded.config, "precision": "bf16_autocast"})
    if target == "trl" and loaded.config["loss"] != "trl_fused":
        # A search for TRL (trainer=trl) simulates its own LM head; the fixed QLoRA study did not.
        loaded = dataclasses.replace(loaded, config={**loaded.config, "loss": "trl_fused"})
    if target in ("axolotl", "llamafactory") and loaded.config["loss"] == "trl_fused":
        # The TRL search's run under transformers' own loss, which these trainers compute.
        loaded = dataclasses.replace(loaded, config={**loaded.config, "loss": "full"})
    if target == "llamafactory" and loaded.config["offload_activations"] == "cpu":
        # LLaMA-Factory offloads no saved activations (test_export_llamafactory.py holds its
        # refusal): the fixed QLoRA ZeRO-3 study stands for its layout without them.
        loaded = dataclasses.replace(loaded, config={**loaded.config, "offload_activations": "off"})
    if (target, loaded.model, loaded.config["train_mode"]) == ("diffusers", "flux_dev", "lora"):
        # The script holds its text encoders either way (see test_diffusers_flux_lora_...).
        loaded = dataclasses.replace(loaded, config={**loaded.config, "encoders": "online"})
    return loaded


def test_diffusers_flux_lora_refuses_cached_encoders_it_keeps_on_the_gpu(workdir: Path) -> None:
    loaded = load_point(Path("results") / FLUX / "summary.json", None, None)
    assert loaded.config["encoders"] == "cached"
    with pytest.raises(Refused, match="keeps both text encoders on the GPU through training"):
        TARGETS["diffusers"].run(loaded, workdir / "out")


def export(
    workdir: Path, target: str, study: str, point: int | None, batch: int | None, case: str
) -> Path:
    loaded = point_for(target, study, point, batch)
    out = (workdir / "results" / study / "export" / target / case).resolve()
    write_export(TARGETS[target].run(loaded, out))
    return out


def _normalized(path: Path, workdir: Path) -> str:
    return path.read_text().replace(str(workdir.resolve()), WORKDIR)


@pytest.mark.parametrize(
    "target,study,point,batch,case", CASES, ids=[f"{c[0]}-{c[4]}" for c in CASES]
)
def test_export_matches_its_golden_files(
    workdir: Path, target: str, study: str, point: int | None, batch: int | None, case: str
) -> None:
    out = export(workdir, target, study, point, batch, case)
    golden = GOLDEN / target / case
    written = {p.name: _normalized(p, workdir) for p in sorted(out.iterdir())}
    if REGENERATE:
        shutil.rmtree(golden, ignore_errors=True)
        golden.mkdir(parents=True)
        for name, text in written.items():
            (golden / name).write_text(text)
    expected = {p.name: p.read_text() for p in sorted(golden.iterdir())}
    assert sorted(written) == sorted(expected)
    for name in expected:
        assert written[name] == expected[name], (
            f"{target}/{case}/{name} differs from its golden file"
        )


def _all(workdir: Path, target: str) -> list[tuple[Path, Any]]:
    """Every export of `target` among the golden cases, with the point it came from."""
    outs = []
    for t, study, point, batch, case in CASES:
        if t == target:
            outs.append(
                (export(workdir, t, study, point, batch, case), point_for(t, study, point, batch))
            )
    return outs


# --- accelerate: its own config loader, launch validation and DeepSpeed plugin ------------------


def test_accelerate_configs_load_and_launch_with_accelerate(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    exports = _all(workdir, "accelerate") + _all(workdir, "diffusers") + _all(workdir, "trl")
    assert len(exports) == 8
    for out, point in exports:
        path = out / "accelerate_config.yaml"
        config = load_config_from_file(str(path))
        assert isinstance(config, ClusterConfig)
        assert config.num_processes == point.world_size
        expected_mp = {"bf16": "bf16", "fp16": "fp16", "fp32": "no", "bf16_pure": "no"}
        assert config.mixed_precision == expected_mp[point.config["precision"]]
        args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
        args, defaults, _ = _validate_launch_command(args)
        stage = point.config["zero_stage"]
        assert args.use_deepspeed == bool(stage)
        if not stage:
            assert config.distributed_type.value == "NO"
            continue
        # What `accelerate launch` hands the training process, and the DeepSpeed config
        # accelerate builds from it there.
        args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)
        _, env = prepare_deepspeed_cmd_env(args)
        for key, value in env.items():
            if key.startswith("ACCELERATE_"):
                monkeypatch.setenv(key, value)
        ds = DeepSpeedPlugin().deepspeed_config
        assert ds["zero_optimization"]["stage"] == stage
        assert (
            ds["zero_optimization"]["offload_optimizer"]["device"]
            == point.config["offload_optimizer"]
        )
        assert ds["gradient_accumulation_steps"] == point.accumulation == 2


# --- DeepSpeed: its own config parser ----------------------------------------------------------


class _DataParallel:
    """What DeepSpeedConfig asks an mpu for: the data-parallel world size of the run."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def get_data_parallel_world_size(self) -> int:
        return self.world_size


def test_deepspeed_configs_pass_deepspeeds_parser(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import deepspeed.runtime.config
    from deepspeed.runtime.config import DeepSpeedConfig

    # As rank 0 of the run: without a process group DeepSpeedConfig would assume one GPU and
    # ignore the run's data-parallel size.
    monkeypatch.setattr(deepspeed.runtime.config.dist, "get_rank", lambda: 0)

    exports = _all(workdir, "deepspeed") + [
        (out, point)
        for out, point in _all(workdir, "simpletuner")
        if (out / "ds_config.json").exists()
    ]
    assert len(exports) == 4
    for out, point in exports:
        ds = DeepSpeedConfig(str(out / "ds_config.json"), mpu=_DataParallel(point.world_size))
        assert ds.train_micro_batch_size_per_gpu == point.micro_batch
        assert ds.gradient_accumulation_steps == point.accumulation
        assert ds.train_batch_size == point.global_batch
        assert ds.zero_optimization_stage == point.config["zero_stage"]
        if point.config["zero_stage"]:
            assert ds.bfloat16_config.enabled == (point.config["precision"] == "bf16")
            offload = ds.zero_config.offload_optimizer
            device = getattr(offload.device, "value", offload.device) if offload else "none"
            assert device == point.config["offload_optimizer"]
        else:
            # No ZeRO: fp32 weights under torch autocast, or a bf16 model with no block.
            assert not ds.bfloat16_config.enabled
            assert ds.torch_autocast_enabled == (point.config["precision"] in ("bf16", "fp16"))


# --- SimpleTuner: its documented option list (it needs Python >= 3.12; this venv is 3.11) -----


def _simpletuner_parser(options: dict[str, Any]) -> argparse.ArgumentParser:
    """SimpleTuner 4.10.1's parser rebuilt from the captured option list: the same flags, types
    and choices, with its boolean parsing (true/false/1/0/yes/no)."""

    def boolean(text: str) -> bool:
        if text.lower() in ("true", "1", "yes", "y", "on"):
            return True
        if text.lower() in ("false", "0", "no", "n", "off"):
            return False
        raise argparse.ArgumentTypeError(f"not a boolean: {text}")

    types = {"int": int, "float": float, "bool": boolean}
    parser = argparse.ArgumentParser(exit_on_error=False)
    for option in options.values():
        parser.add_argument(
            *option["flags"], type=types.get(option["type"], str), choices=option["choices"]
        )
    return parser


def _simpletuner_cli(config: dict[str, Any]) -> list[str]:
    """config.json as SimpleTuner's loader turns it into arguments (--key=value, booleans lower)."""
    args = []
    for key, value in config.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        args.append(f"{key if key.startswith('--') else '--' + key}={text}")
    return args


def test_simpletuner_configs_parse_with_its_documented_options(workdir: Path) -> None:
    documented = json.loads((FIXTURES / "simpletuner_4.10.1.json").read_text())
    parser = _simpletuner_parser(documented["options"])
    exports = _all(workdir, "simpletuner")
    assert len(exports) == 3
    for out, point in exports:
        config = json.loads((out / "config.json").read_text())
        parsed = parser.parse_args(_simpletuner_cli(config))
        assert parsed.train_batch_size == point.micro_batch
        assert parsed.resolution == point.config["resolution"]
        assert parsed.gradient_checkpointing is point.config["checkpointing"]
        assert parsed.gradient_accumulation_steps == point.accumulation
        assert parsed.optimizer in documented["optimizers"]
        assert parsed.optimizer not in documented["deprecated_optimizers"]
        if point.config["train_mode"] == "qlora":
            assert parsed.base_model_precision == "nf4-bnb"
        backends = json.loads((out / "multidatabackend.json").read_text())
        for backend in backends:
            assert set(backend) <= set(documented["databackend_keys"]), backend
            for key, choices in documented["databackend_choices"].items():
                assert backend.get(key, choices[0]) in choices
        assert config["data_backend_config"].endswith("/multidatabackend.json")


# --- kohya sd-scripts: TOML, its options, its dataset schema and its rules ---------------------


def test_kohya_tomls_follow_sd_scripts(workdir: Path) -> None:
    documented = json.loads((FIXTURES / "sd_scripts_options.json").read_text())
    exports = _all(workdir, "kohya")
    assert len(exports) == 2
    for out, point in exports:
        train = tomllib.loads((out / "train.toml").read_text())
        command = json.loads((out / "export.json").read_text())["command"]
        script = next(w for w in command.split() if w.endswith(".py"))
        assert set(train) <= set(documented["options"][script.removesuffix(".py")]), script
        dataset = tomllib.loads((out / "dataset.toml").read_text())
        assert set(dataset["general"]) <= set(documented["dataset"]["general"])
        for entry in dataset["datasets"]:
            assert set(entry) - {"subsets"} <= set(documented["dataset"]["datasets"])
            for subset in entry["subsets"]:
                assert set(subset) <= set(documented["dataset"]["subsets"])
            assert entry["batch_size"] == point.micro_batch
            assert entry["resolution"] == point.config["resolution"]
        assert train["dataset_config"] == str(out / "dataset.toml")
        assert train["gradient_accumulation_steps"] == point.accumulation
        # sd-scripts' rules: blocks_to_swap within the model's maximum, never with CPU-offloaded
        # checkpointing.
        swap = train.get("blocks_to_swap", 0)
        assert swap == point.config["swap_blocks"]
        assert swap <= 35  # Flux.1: 19 double and 38 single blocks
        assert not (swap and train.get("cpu_offload_checkpointing"))
        assert train.get("full_bf16", False) == (point.config["precision"] == "bf16_autocast")


def test_kohya_sdxl_in_fp16_runs_the_vae_in_fp32_as_its_guide_asks(workdir: Path) -> None:
    """sd-scripts' SDXL guide asks for --no_half_vae under fp16. With cached latents the VAE
    leaves the GPU before training, so the export writes it; with latents encoded every step it
    would hold the VAE in fp32 on the GPU, more than measured, so the export warns instead."""
    from autofit.export.point import StudyPoint

    def exported(encoders: str) -> Any:
        config = {
            **knob_defaults(), "train_mode": "lora", "resolution": 1024, "precision": "fp16",
            "encoders": encoders,
        }  # fmt: skip
        point = StudyPoint(
            study="sdxl", summary_path=workdir / "summary.json", preset=load_preset("sdxl"),
            gpu="rtx3060_12", backend="simulate", label="best", config=config, peak_bytes=1,
            budget_bytes=2, samples_per_s=1.0,
        )  # fmt: skip
        return TARGETS["kohya"].run(point, workdir / encoders)

    cached = exported("cached")
    assert tomllib.loads(cached.files["train.toml"])["no_half_vae"] is True
    assert not any("no_half_vae" in w for w in cached.warnings)
    online = exported("online")
    assert "no_half_vae" not in tomllib.loads(online.files["train.toml"])
    assert any("--no_half_vae" in w and "encoders=cached" in w for w in online.warnings)


def test_kohya_refuses_more_blocks_than_sd_scripts_swaps(workdir: Path) -> None:
    point = load_point(Path("results") / FLUX / "summary.json", 3)
    point = dataclasses.replace(point, config={**point.config, "swap_blocks": 36})
    with pytest.raises(ConfigError, match="swaps at most 35 blocks of flux_dev"):
        TARGETS["kohya"].run(point, workdir / "out")


def test_kohya_block_swap_limits_follow_its_formula(workdir: Path) -> None:
    point = load_point(Path("results") / FLUX / "summary.json", 3)
    assert kohya_max_blocks_to_swap(point.family, point.preset.architecture) == 35
    assert kohya_max_blocks_to_swap("sd3", {"num_layers": 38}) == 36  # SD3.5 Large
    assert kohya_max_blocks_to_swap("sdxl", {}) is None


# --- kohya-ss musubi-tuner: its option names, dataset keys and rules ------------------------------

# Read from kohya-ss/musubi-tuner at MUSUBI_COMMIT (not on PyPI: its parser cannot be run here).
MUSUBI_COMMIT = "30c658c4f4b0bf05038b3346eff9670259b10fc7"  # 2026-06-24, merge of PR #982
# The option strings of every add_argument in src/musubi_tuner/training/parser_common.py.
MUSUBI_COMMON = """
--async_upload --base_weights --base_weights_multiplier --block_swap_h2d_only
--block_swap_ring_size --blocks_to_swap --compile --compile_backend --compile_cache_size_limit
--compile_dynamic --compile_fullgraph --compile_mode --config_file --cuda_allow_tf32
--cuda_cudnn_benchmark --dataset_config --ddp_gradient_as_bucket_view --ddp_static_graph
--ddp_timeout --dim_from_weights --disable_numpy_memmap --discrete_flow_shift --dit
--dynamo_backend --dynamo_dynamic --dynamo_fullgraph --dynamo_mode --flash3 --flash_attn
--fp8_base --gradient_accumulation_steps --gradient_checkpointing
--gradient_checkpointing_cpu_offload --guidance_scale --huggingface_path_in_repo
--huggingface_repo_id --huggingface_repo_type --huggingface_repo_visibility --huggingface_token
--img_in_txt_in_offloading --learning_rate --log_config --log_prefix --log_tracker_config
--log_tracker_name --log_with --logging_dir --logit_mean --logit_std --lr_decay_steps
--lr_scheduler --lr_scheduler_args --lr_scheduler_min_lr_ratio --lr_scheduler_num_cycles
--lr_scheduler_power --lr_scheduler_timescale --lr_scheduler_type --lr_warmup_steps
--max_data_loader_n_workers --max_grad_norm --max_timestep --max_train_epochs --max_train_steps
--metadata_arch --metadata_author --metadata_description --metadata_license --metadata_reso
--metadata_tags --metadata_title --min_timestep --mixed_precision --mode_scale --network_alpha
--network_args --network_dim --network_dropout --network_module --network_weights --no_metadata
--num_timestep_buckets --optimizer_args --optimizer_type --output_dir --output_name
--persistent_data_loader_workers --preserve_distribution_shape --resume
--resume_from_huggingface --sage_attn --sample_at_first --sample_every_n_epochs
--sample_every_n_steps --sample_prompts --save_every_n_epochs --save_every_n_steps
--save_last_n_epochs --save_last_n_epochs_state --save_last_n_steps --save_last_n_steps_state
--save_precision --save_state --save_state_on_train_end --save_state_to_huggingface
--scale_weight_norms --sdpa --seed --show_timesteps --sigmoid_scale --split_attn
--timestep_sampling --training_comment --use_pinned_memory_for_block_swap --vae --vae_dtype
--wandb_api_key --wandb_run_name --weighting_scheme --xformers
""".split()
# Each training script's own add_argument option strings, beside the common ones.
MUSUBI_SCRIPTS = {
    "src/musubi_tuner/wan_train_network.py": """--clip --dit_high_noise
    --force_v2_1_time_embedding --fp8_scaled --fp8_t5 --offload_inactive_dit --one_frame --t5
    --task --timestep_boundary --vae_cache_cpu""".split(),
    "src/musubi_tuner/hv_train_network.py": """--dit_dtype --dit_in_channels --fp8_llm
    --text_encoder1 --text_encoder2 --text_encoder_dtype --vae_chunk_size
    --vae_spatial_tile_sample_min_size --vae_tiling""".split(),
}
# The caching scripts' option strings (Wan's extend cache_latents.py's and
# cache_text_encoder_outputs.py's setup_parser_common; --i2v is wan_cache_latents.py's own).
MUSUBI_CACHE_LATENTS = """--batch_size --console_back --console_num_images --console_width
--dataset_config --debug_mode --device --disable_cudnn_backend --i2v --keep_cache --num_workers
--skip_existing --vae --vae_chunk_size --vae_dtype --vae_spatial_tile_sample_min_size
--vae_tiling""".split()
MUSUBI_CACHE_TEXT = """--batch_size --dataset_config --device --fp8_llm --keep_cache
--num_workers --skip_existing --text_encoder1 --text_encoder2 --text_encoder_dtype""".split()
MUSUBI_CACHING = {
    "src/musubi_tuner/cache_latents.py": MUSUBI_CACHE_LATENTS,
    "src/musubi_tuner/wan_cache_latents.py": [
        *MUSUBI_CACHE_LATENTS, "--vae_cache_cpu", "--clip", "--i2v", "--one_frame",
    ],
    "src/musubi_tuner/cache_text_encoder_outputs.py": MUSUBI_CACHE_TEXT,
    "src/musubi_tuner/wan_cache_text_encoder_outputs.py": [*MUSUBI_CACHE_TEXT, "--t5", "--fp8_t5"],
}  # fmt: skip
# dataset/config_utils.py ConfigSanitizer: [general] takes DATASET_ASCENDABLE_SCHEMA's keys, a
# video [[datasets]] those and VIDEO_DATASET_DISTINCT_SCHEMA's.
MUSUBI_GENERAL = [
    "caption_extension", "batch_size", "num_repeats", "resolution", "enable_bucket",
    "bucket_no_upscale",
]  # fmt: skip
MUSUBI_VIDEO_DATASET = [
    "video_directory", "video_jsonl_file", "control_directory", "target_frames",
    "frame_extraction", "frame_stride", "frame_sample", "max_frames", "cache_directory",
    "source_fps", "fp_latent_window_size",
]  # fmt: skip
MUSUBI_FRAME_EXTRACTION = ["head", "chunk", "slide", "uniform", "full"]  # docs/dataset_config.md
# wan/configs/__init__.py WAN_CONFIGS
MUSUBI_TASKS = [
    "t2v-14B", "t2v-1.3B", "i2v-14B", "t2i-14B", "flf2v-14B", "t2v-1.3B-FC", "t2v-14B-FC",
    "i2v-14B-FC", "i2v-A14B", "t2v-A14B",
]  # fmt: skip
ACCELERATE_LAUNCH = ["--num_cpu_threads_per_process", "--num_processes", "--mixed_precision"]


def _shell_words(text: str) -> list[str]:
    """A shell script's words, its continued lines joined and its comments dropped."""
    return shlex.split(text.replace("\\\n", " "), comments=True)


def _options(words: list[str]) -> dict[str, list[str]]:
    """Each --option of `words` with the words that follow it up to the next option."""
    options: dict[str, list[str]] = {}
    current = None
    for word in words:
        if word.startswith("--"):
            current = options.setdefault(word, [])
        elif current is not None:
            current.append(word)
    return options


def test_musubi_files_use_musubi_tuners_names(workdir: Path) -> None:
    """Every key of the written dataset TOML (read with tomllib) and every option of the launch
    and caching commands is one of musubi-tuner's, as read from kohya-ss/musubi-tuner at
    30c658c4f4b0bf05038b3346eff9670259b10fc7 (2026-06-24): the option strings of every
    add_argument of src/musubi_tuner/training/parser_common.py, wan_train_network.py,
    hv_train_network.py and the caching scripts, the dataset keys of dataset/config_utils.py's
    ConfigSanitizer, and the --task values of wan/configs/__init__.py."""
    exports = _all(workdir, "musubi")
    assert len(exports) == 3
    for out, point in exports:
        dataset = tomllib.loads((out / "dataset.toml").read_text())
        assert set(dataset) == {"general", "datasets"}
        assert set(dataset["general"]) <= set(MUSUBI_GENERAL)
        height, width = point.preset.shape(point.config["resolution"])
        assert dataset["general"]["resolution"] == [width, height]  # musubi's [W, H]
        assert dataset["general"]["batch_size"] == point.micro_batch
        frames = point.config["frames"] or point.preset.inputs["frames"]
        for entry in dataset["datasets"]:
            assert set(entry) <= set(MUSUBI_GENERAL) | set(MUSUBI_VIDEO_DATASET)
            assert entry["target_frames"] == [frames] and (frames - 1) % 4 == 0
            assert entry["frame_extraction"] in MUSUBI_FRAME_EXTRACTION
            assert not Path(entry["video_directory"]).is_absolute()
            assert not Path(entry["cache_directory"]).is_absolute()

        words = _shell_words((out / "train.sh").read_text())
        script = next(w for w in words if w.endswith(".py"))
        launcher = words[words.index("accelerate") + 2 : words.index(script)]
        assert set(_options(launcher)) <= set(ACCELERATE_LAUNCH)
        options = _options(words[words.index(script) + 1 :] + words[: words.index("accelerate")])
        assert set(options) <= set(MUSUBI_COMMON) | set(MUSUBI_SCRIPTS[script]), script
        attention = {"--sdpa", "--flash_attn", "--sage_attn", "--xformers", "--flash3"}
        assert len(attention & set(options)) == 1  # musubi-tuner requires exactly one
        assert options["--dataset_config"] == [str(out / "dataset.toml")]
        assert options["--mixed_precision"] == _options(launcher)["--mixed_precision"]
        assert options["--network_module"] == (
            ["networks.lora_wan"] if point.family == "wan" else ["networks.lora"]
        )
        assert options["--network_dim"] == [str(point.config["lora_rank"])]
        assert options["--gradient_accumulation_steps"] == [str(point.accumulation)]
        if point.family == "wan":
            assert options["--task"][0] in MUSUBI_TASKS
        swap = int(options.get("--blocks_to_swap", ["0"])[0])
        assert swap == point.config["swap_blocks"]
        assert swap <= (point.preset.architecture.get("num_layers", 0) - 1 or 36)
        for line in (out / "cache.sh").read_text().splitlines():
            if line.startswith("python "):
                cached = _shell_words(line)
                assert set(_options(cached[2:])) <= set(MUSUBI_CACHING[cached[1]]), line


def test_musubi_runs_wan_as_measured_and_refuses_what_it_cannot(workdir: Path) -> None:
    point = point_for("musubi", WAN, None)
    words = _shell_words(TARGETS["musubi"].run(point, workdir / "out").files["train.sh"])
    assert words[words.index("--task") + 1] == "t2v-1.3B"
    assert "--gradient_checkpointing" in words and "--fp8_base" not in words
    refused = {
        "precision": "bf16_pure",
        "offload_activations": "cpu",
        "encoders": "online",
        "train_mode": "full",
        "lora_targets": "qv",
        "swap_blocks": 30,  # Wan 1.3B's 30 blocks: musubi-tuner swaps 29 at most
    }
    for knob, value in refused.items():
        changed = dataclasses.replace(point, config={**point.config, knob: value})
        with pytest.raises(Refused, match=f"cannot express {knob}="):
            TARGETS["musubi"].run(changed, workdir / "out")
    a14b = dataclasses.replace(point, preset=load_preset("wan2_2_t2v_a14b"))
    words = _shell_words(TARGETS["musubi"].run(a14b, workdir / "out").files["train.sh"])
    assert words[words.index("--task") + 1] == "t2v-A14B"
    assert "--force_v2_1_time_embedding" in words  # the per-clip time embedding measured
    # Wan 2.2's image-to-video expert: its task, and the first frame's latents cached too.
    i2v = dataclasses.replace(point, preset=load_preset("wan2_2_i2v_a14b"))
    files = TARGETS["musubi"].run(i2v, workdir / "out").files
    words = _shell_words(files["train.sh"])
    assert words[words.index("--task") + 1] == "i2v-A14B"
    assert "--force_v2_1_time_embedding" in words
    cache = [line.split() for line in files["cache.sh"].splitlines() if "wan_cache_latents" in line]
    assert (
        len(cache) == 1
        and "--i2v" in cache[0]
        and set(w for w in cache[0] if w.startswith("--")) <= set(MUSUBI_CACHE_LATENTS)
    )
    # Wan 2.1's: its task, and its CLIP image embedding cached beside the first frame's latents.
    i2v = dataclasses.replace(point, preset=load_preset("wan2_1_i2v_14b"))
    files = TARGETS["musubi"].run(i2v, workdir / "out").files
    words = _shell_words(files["train.sh"])
    assert words[words.index("--task") + 1] == "i2v-14B"
    assert "--force_v2_1_time_embedding" not in words
    cache = [
        _shell_words(line) for line in files["cache.sh"].splitlines() if "wan_cache_latents" in line
    ]
    assert len(cache) == 1 and "--i2v" in cache[0]
    assert _options(cache[0][2:])["--clip"] == [
        "path/to/models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"
    ]
    # Wan 2.2 TI2V 5B: no task of musubi-tuner's trains it.
    ti2v = dataclasses.replace(point, preset=load_preset("wan2_2_ti2v_5b"))
    with pytest.raises(ConfigError) as refused:
        TARGETS["musubi"].run(ti2v, workdir / "out")
    assert str(refused.value) == (
        "target=musubi cannot train wan2_2_ti2v_5b (Wan 2.2 TI2V 5B): musubi-tuner's "
        "wan_train_network.py has no ti2v-5B task (wan/configs/__init__.py WAN_CONFIGS at 30c658c4)"
    )


# --- Sana: its config layout -----------------------------------------------------------------


def test_sana_overlay_is_in_sanas_config_layout(workdir: Path) -> None:
    fields = json.loads((FIXTURES / "sana_config_fields.json").read_text())
    ((out, point),) = _all(workdir, "sana")
    text = (out / "sana_overlay.yaml").read_text()
    overlay = yaml.safe_load(text)
    assert set(overlay) <= set(fields["top_level"])
    for section, values in overlay.items():
        assert set(values) <= set(fields[section]), section
    assert overlay["model"]["mixed_precision"] in fields["mixed_precision"]
    assert overlay["train"]["optimizer"]["type"] in fields["optimizer_types"]
    assert overlay["train"]["train_batch_size"] == point.micro_batch
    assert overlay["train"]["gradient_accumulation_steps"] == point.accumulation == 2
    # The shipped config's training hyperparameters, written out and marked for review.
    assert overlay["train"]["optimizer"]["lr"] == 1e-4 and overlay["train"]["num_epochs"] == 100
    assert f"# {MARK}: " in text
    # The launch command carries the same values as pyrallis flags.
    command = json.loads((out / "export.json").read_text())["command"]
    flags = dict(
        a[2:].split("=", 1)
        for a in shlex.split(command)
        if a.startswith("--") and "." in a.split("=")[0]
    )
    for section, values in overlay.items():
        for key, value in values.items():
            assert yaml.safe_load(flags[f"{section}.{key}"]) == value


# --- diffusers: the example scripts' own options --------------------------------------------


def test_diffusers_arguments_exist_in_the_example_scripts(workdir: Path) -> None:
    documented = json.loads((FIXTURES / "diffusers_examples_options.json").read_text())["scripts"]
    exports = _all(workdir, "diffusers")
    assert len(exports) == 2
    for out, point in exports:
        words = shlex.split((out / "launch.sh").read_text().splitlines()[-1])
        script = next(w for w in words if w.endswith(".py"))
        options = documented[script]
        values = {}
        for word in words[words.index(script) + 1 :]:
            name, _, value = word[2:].partition("=")
            assert name in options, f"{script} has no --{name}"
            assert options[name]["flag"] == (value == ""), f"--{name} of {script}"
            if options[name]["choices"]:
                assert value in options[name]["choices"]
            values[name] = value
        assert int(values["train_batch_size"]) == point.micro_batch
        assert int(values["resolution"]) == point.config["resolution"]
        assert ("gradient_checkpointing" in values) == point.config["checkpointing"]


# --- TRL: its own parser reads sft.yaml, and train.py trains -----------------------------------


def _trl_arguments(sft: Path, *overrides: str) -> Any:
    """sft.yaml as train.py reads it: TRL's TrlParser over its three argument dataclasses (on this
    GPU-less machine the Trainer's bf16 check needs use_cpu)."""
    from trl import ModelConfig, ScriptArguments, SFTConfig, TrlParser

    parser = TrlParser((ScriptArguments, SFTConfig, ModelConfig))
    return parser.parse_args_and_config(["--config", str(sft), "--use_cpu", "true", *overrides])


def test_trl_settings_are_read_by_trls_own_parser(workdir: Path) -> None:
    exports = _all(workdir, "trl")
    assert len(exports) == 3
    for out, point in exports:
        script, training, model = _trl_arguments(out / "sft.yaml")
        config = point.config
        assert training.per_device_train_batch_size == point.micro_batch
        assert training.gradient_accumulation_steps == point.accumulation
        assert training.max_length == config["resolution"]
        assert training.activation_checkpointing == config["checkpointing"]
        assert training.bf16 and not training.fp16  # the fixtures' precision=bf16
        assert training.optim == "adamw_torch_fused"
        assert training.activation_offloading == (config["offload_activations"] == "cpu")
        assert training.learning_rate == 1e-4  # TRL's documented rate for adapters
        assert model.use_peft and model.lora_r == config["lora_rank"] and model.lora_dropout == 0
        assert model.load_in_4bit == (config["train_mode"] == "qlora")
        # ZeRO-3 partitions a 4-bit base only if it is stored in the 16-bit dtype.
        assert (model.bnb_4bit_quant_storage == "bfloat16") == (config["zero_stage"] == 3)
        assert model.dtype == "bfloat16" and model.attn_implementation == "sdpa"
        assert script.dataset_name == "path/to/dataset"


def test_trl_refuses_what_it_does_not_run_as_measured(workdir: Path) -> None:
    loaded = point_for("trl", TRL_SEARCH, None)
    for change, knob in (
        ({"loss": "full"}, "loss"),  # TRL scores tokens through its own fused LM head
        ({"precision": "bf16_pure"}, "precision"),  # PEFT's fp32 adapters on a bf16 model
        ({"loss": "fused_linear"}, "loss"),
        ({"optimizer_impl": "for_loop"}, "optimizer_impl"),
        ({"kbit_prep": "peft", "train_mode": "qlora", "precision": "bf16_autocast"}, "kbit_prep"),
    ):
        changed = dataclasses.replace(loaded, config={**loaded.config, **change})
        with pytest.raises(Refused) as refused:
            TARGETS["trl"].run(changed, workdir / "out")
        assert refused.value.knob == knob, str(refused.value)


def test_trl_train_py_trains_two_steps_on_cpu(workdir: Path) -> None:
    """The exported script, as written, on a tiny Llama built from a config (random weights, a
    word-level tokenizer made here: nothing downloaded) and a ten-line dataset."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = export(workdir, "trl", TRL_SEARCH, 2, 8, "llama_lora_checkpointing")
    words = [f"w{i}" for i in range(200)]
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    model_dir = workdir / "tiny-llama"
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    ).save_pretrained(model_dir)
    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(model_dir)
    data = workdir / "tiny-data"
    data.mkdir()
    lines = [json.dumps({"text": " ".join(words[i * 7 : i * 7 + 30])}) for i in range(10)]
    (data / "train.jsonl").write_text("\n".join(lines) + "\n")

    run = subprocess.run(
        [
            sys.executable, str(out / "train.py"), "--config", str(out / "sft.yaml"),
            "--model_name_or_path", str(model_dir), "--dataset_name", str(data),
            "--use_cpu", "true", "--max_steps", "2", "--logging_steps", "1",
            "--output_dir", str(workdir / "trained"), "--save_strategy", "no",
        ],
        capture_output=True, text=True, timeout=600, cwd=workdir,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    steps = re.findall(r"\{'loss': '[0-9.]+'", run.stdout + run.stderr)
    assert len(steps) == 2, run.stdout[-2000:]
    assert (workdir / "trained" / "adapter_model.safetensors").is_file()


# --- hydra: autofit probe accepts the overrides -----------------------------------------------


def test_hydra_overrides_compose_for_autofit_probe(workdir: Path) -> None:
    from autofit.config import compose_config
    from autofit.knobs import parse_all, registry

    checked = 0
    for out, point in _all(workdir, "hydra"):
        overrides = yaml.safe_load((out / "overrides.yaml").read_text())
        unknown = sorted(set(point.config) - set(registry()))
        if point.model not in group_options("model") or unknown:
            continue  # a preset or knobs this autofit does not have (yet): probe would refuse
        cfg = compose_config("probe", overrides)
        assert cfg.model.name == point.model and cfg.gpu.name == point.gpu
        assert parse_all({k: cfg[k] for k in point.config}) == parse_all(point.config)
        checked += 1
    if not checked:
        pytest.skip("autofit probe here lacks the fixture's presets or knobs")


# --- training hyperparameters memory does not decide: the trainers' documented values ----------


def _flux(point: int | None, **config: Any) -> Any:
    loaded = load_point(Path("results") / FLUX / "summary.json", point)
    return dataclasses.replace(loaded, config={**loaded.config, **config})


def test_a_kohya_flux_lora_trains_at_the_documented_rate_with_flux_flags(workdir: Path) -> None:
    out = export(workdir, "kohya", FLUX, None, 4, "flux_lora")
    text = (out / "train.toml").read_text()
    train = tomllib.loads(text)
    # sd-scripts' own default is 2e-6; its FLUX.1 LoRA guide trains at 1e-4, for 10 epochs.
    assert train["learning_rate"] == 1e-4
    assert train["max_train_epochs"] == 10 and train["lr_scheduler"] == "constant"
    # FLUX.1 [dev]'s flags: guidance 1.0 (its default 3.5 fights dev's distilled guidance).
    assert train["guidance_scale"] == 1.0
    assert train["timestep_sampling"] == "flux_shift"
    assert train["model_prediction_type"] == "raw"
    for key in ("learning_rate", "max_train_epochs", "guidance_scale", "timestep_sampling"):
        (line,) = [line for line in text.splitlines() if line.startswith(f"{key} = ")]
        assert line.endswith(f"# {MARK}"), line
    # What memory decided is as measured.
    assert train["optimizer_type"] == "AdamW8bit" and train["network_dim"] == 16
    assert train["gradient_accumulation_steps"] == 4
    readme = (out / "README.txt").read_text()
    assert (
        "checked against: kohya-ss/sd-scripts at 48d368fa557731ad0488c07304dfeba8c07910eb" in readme
    )
    assert (
        "sd-scripts/blob/48d368fa557731ad0488c07304dfeba8c07910eb/docs/flux_train_network.md"
        in readme
    )


def test_a_kohya_flux_full_fine_tune_takes_the_full_fine_tune_defaults(workdir: Path) -> None:
    out = export(workdir, "kohya", FLUX, 3, None, "flux_full_swap")
    train = tomllib.loads((out / "train.toml").read_text())
    assert train["learning_rate"] == 1e-5  # sd-scripts' fine-tuning guide for flux_train.py
    assert train["max_train_steps"] == 10000 and "max_train_epochs" not in train
    assert train["guidance_scale"] == 1.0 and train["timestep_sampling"] == "flux_shift"
    assert train["optimizer_type"] == "Adafactor" and train["blocks_to_swap"] == 24


def test_simpletuner_flux_gets_its_rate_and_guidance_or_says_none_is_documented(
    workdir: Path,
) -> None:
    parser = _simpletuner_parser(
        json.loads((FIXTURES / "simpletuner_4.10.1.json").read_text())["options"]
    )
    # SimpleTuner adapts the joint attention of both streams of Flux (flux_lora_target=all)
    flux_lora = _flux(None, precision="bf16_autocast", lora_targets="joint_attention")
    lora = TARGETS["simpletuner"].run(flux_lora, workdir / "lora")
    config = json.loads(lora.files["config.json"])
    parser.parse_args(_simpletuner_cli(config))
    assert config["learning_rate"] == 1e-4  # SimpleTuner's own default is 4e-7
    assert config["flux_guidance_mode"] == "constant" and config["flux_guidance_value"] == 1.0
    assert config["max_train_steps"] == 10000 and config["base_model_precision"] == "no_change"
    (note,) = [n for n in lora.notes if n.startswith(MARK)]
    assert note.endswith("config.json holds them unmarked (JSON has no comments)")

    full = TARGETS["simpletuner"].run(
        _flux(None, precision="bf16_autocast", train_mode="full"), workdir / "full"
    )
    config = json.loads(full.files["config.json"])
    assert "learning_rate" not in config and config["flux_guidance_value"] == 1.0
    write_export(full)
    readme = (workdir / "full" / "README.txt").read_text()
    assert "  - learning_rate: not documented: SimpleTuner's documentation gives no" in readme
    assert any(n.startswith("choose learning_rate for flux (full): ") for n in full.notes)


# --- the Flux-derived presets: Chroma's family and schnell's own names -------------------------


def _as(model: str, point: int | None = None, **config: Any) -> Any:
    """The Flux study's point, trained on another preset of the same shapes' kind."""
    loaded = _flux(point, **config)
    return dataclasses.replace(loaded, preset=load_preset(model))


def test_kohya_trains_chroma_as_flux_network_lora_with_its_model_type(workdir: Path) -> None:
    documented = json.loads((FIXTURES / "sd_scripts_options.json").read_text())["options"]
    plan = TARGETS["kohya"].run(_as("chroma", precision="bf16_autocast"), workdir / "chroma")
    train = tomllib.loads(plan.files["train.toml"])
    assert " flux_train_network.py --config_file " in plan.command
    assert set(train) <= set(documented["flux_train_network"])
    # sd-scripts' Chroma: --model_type chroma, its T5 mask asserted, no CLIP-L.
    assert train["model_type"] == "chroma" and train["apply_t5_attn_mask"] is True
    assert "clip_l" not in train and train["t5xxl"] == "path/to/t5xxl_fp16.safetensors"
    assert train["network_module"] == "networks.lora_flux"
    # Chroma's documented flags, its learning rate undocumented.
    assert train["guidance_scale"] == 0.0 and train["timestep_sampling"] == "sigmoid"
    assert "learning_rate" not in train
    assert any(n.startswith("choose learning_rate for chroma (lora): ") for n in plan.notes)
    with pytest.raises(Refused, match=re.escape("sd-scripts fine-tunes no chroma model in full")):
        TARGETS["kohya"].run(_as("chroma", 3), workdir / "full")


def test_simpletuner_trains_chroma_as_its_chroma_family(workdir: Path) -> None:
    parser = _simpletuner_parser(
        json.loads((FIXTURES / "simpletuner_4.10.1.json").read_text())["options"]
    )
    point = _as("chroma", precision="bf16_autocast", lora_targets="joint_attention")
    config = json.loads(TARGETS["simpletuner"].run(point, workdir).files["config.json"])
    parsed = parser.parse_args(_simpletuner_cli(config))
    assert parsed.model_family == "chroma" and parsed.model_flavour == "base"
    assert "pretrained_model_name_or_path" not in config and config["learning_rate"] == 2e-4
    assert "flux_guidance_value" not in config  # FLUX.1 [dev]'s distilled guidance only


def test_schnell_tells_its_trainers_what_they_need_for_it(workdir: Path) -> None:
    parser = _simpletuner_parser(
        json.loads((FIXTURES / "simpletuner_4.10.1.json").read_text())["options"]
    )
    point = _as("flux_schnell", precision="bf16_autocast", lora_targets="joint_attention")
    config = json.loads(TARGETS["simpletuner"].run(point, workdir / "st").files["config.json"])
    parsed = parser.parse_args(_simpletuner_cli(config))
    assert parsed.model_flavour == "schnell" and parsed.flux_fast_schedule is True
    documented = json.loads((FIXTURES / "diffusers_examples_options.json").read_text())["scripts"]
    plan = TARGETS["diffusers"].run(_as("flux_schnell", encoders="online"), workdir / "diffusers")
    assert "--max_sequence_length=256" in shlex.split(plan.command)  # the scripts' own is 512
    assert "max_sequence_length" in documented["examples/dreambooth/train_dreambooth_lora_flux.py"]


def test_diffusers_refuses_chroma_in_one_line(workdir: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        TARGETS["diffusers"].run(_as("chroma"), workdir / "out")
    assert "\n" not in str(refused.value)
    assert "diffusers supports the families" in str(refused.value)
    assert "chroma" not in str(refused.value).split("supports the families")[1]


@pytest.mark.parametrize(
    ("model", "own", "other"),
    [
        ("sd35_medium", "attention", "preset"),  # its DEFAULT_LORA_TARGET: the image stream's
        ("flux_dev", "joint_attention", "preset"),  # flux_lora_target=all: both streams'
        ("sana_1600m", "preset", None),
        ("sdxl", "attention", None),
    ],
)
def test_simpletuner_adapts_its_models_default_modules(
    model: str, own: str, other: str | None
) -> None:
    preset = load_preset(model)
    knob = REGISTRY["lora_targets"]
    subject = Subject({**knob_defaults(), "train_mode": "lora"}, preset)
    assert knob.express("simpletuner", own, subject.with_value("lora_targets", own)).settings == {}
    if other is not None:
        refused = knob.express("simpletuner", other, subject.with_value("lora_targets", other))
        assert isinstance(refused, Refuse) and f"lora_targets={own}" in refused.offers
        assert refused.why.startswith("SimpleTuner's LoRA adapts to_q, to_k, to_v, to_out.0")


def test_simpletuner_trains_pixart_sigma_under_the_family_name_its_parser_takes(
    workdir: Path,
) -> None:
    """SimpleTuner's --model_family choices are its model_metadata.json's keys (its model
    folders): PixArt Sigma's is `pixart`; the `pixart_sigma` of its quickstart is registered only
    when the model's module is imported (helpers/models/registry.py, bghira/SimpleTuner bc8e6ab)."""
    parser = _simpletuner_parser(
        json.loads((FIXTURES / "simpletuner_4.10.1.json").read_text())["options"]
    )
    sana = point_for("simpletuner", SANA, 4)  # LoRA, in bf16 under autocast as SimpleTuner runs it
    sana = dataclasses.replace(sana, config={**sana.config, "precision": "bf16_autocast"})
    for preset, flavour in (("pixart_sigma_1024", "600M-1024"), ("pixart_sigma_512", "600M-512")):
        point = dataclasses.replace(sana, preset=load_preset(preset))
        out = TARGETS["simpletuner"].run(point, workdir / preset)
        config = json.loads(out.files["config.json"])
        parser.parse_args(_simpletuner_cli(config))
        assert (config["model_family"], config["model_flavour"]) == ("pixart", flavour)
        assert config["model_type"] == "lora"


def test_simpletuners_parser_reads_its_checkpointing_schedule_offload_and_torchao_base(
    workdir: Path,
) -> None:
    parser = _simpletuner_parser(
        json.loads((FIXTURES / "simpletuner_4.10.1.json").read_text())["options"]
    )
    point = _flux(
        None, precision="bf16_autocast", lora_targets="joint_attention", checkpointing=True,
        checkpoint_interval=2, checkpoint_stride=4, offload_activations="attention",
        base_precision="fp8wo_torchao",
    )  # fmt: skip
    config = json.loads(TARGETS["simpletuner"].run(point, workdir).files["config.json"])
    parsed = parser.parse_args(_simpletuner_cli(config))
    assert parsed.gradient_checkpointing_interval == 2
    assert parsed.gradient_checkpointing_segment_stride == 4
    assert parsed.gradient_checkpointing_offload_attention is True
    assert parsed.base_model_precision == "fp8wo-torchao"


def test_every_family_and_mode_a_target_trains_has_a_learning_rate_or_says_none_is_documented() -> (
    None
):
    presets = presets_by_family()
    train_mode = REGISTRY["train_mode"]
    assert set(table()) == set(TARGETS), "every target declares its trainer defaults, or none"
    checked = 0
    for name, target in TARGETS.items():
        entry = table()[name]
        assert entry.checked_against
        if target.families is None:  # one's own code, or autofit probe: says why there are none
            assert entry.none and not entry.rows
            continue
        assert entry.none is None and entry.learning_rate
        for row in [*entry.rows, *entry.undocumented]:
            assert set(row.families) <= set(target.families), (name, row.families)
        for row in entry.rows:
            rate = row.settings.get(entry.learning_rate)
            assert rate is None or (isinstance(rate, float) and 0 < rate < 1e-2), (name, row)
        for family in target.families:
            for mode in train_mode.values:
                subject = Subject({**knob_defaults(), "train_mode": mode}, presets[family])
                words = train_mode.express(target.vocabulary, mode, subject, target.own_code)
                if isinstance(words, Refuse):
                    continue  # the trainer does not train the family so
                assert entry.documents_learning_rate(family, mode_of(mode)), (name, family, mode)
                checked += 1
    assert checked >= 20


@pytest.mark.parametrize(
    "target,study,point,batch,case", CASES, ids=[f"{c[0]}-{c[4]}" for c in CASES]
)
def test_every_export_marks_its_training_defaults_for_review(
    workdir: Path, target: str, study: str, point: int | None, batch: int | None, case: str
) -> None:
    out = export(workdir, target, study, point, batch, case)
    exported = json.loads((out / "export.json").read_text())
    defaults = exported["training_defaults"]
    readme = (out / "README.txt").read_text()
    assert f"checked against: {defaults['checked_against']}" in readme
    settings = defaults["settings"]
    if defaults["none"]:
        assert not settings and defaults["none"] in readme
        return
    assert settings, f"{target} launches a trainer: its training hyperparameters are written"
    assert f"training hyperparameters, {MARK}: " in readme
    for key, source in defaults["sources"].items():
        assert key in readme and f"from {source}" in readme
    # Printed with the export (its notes), and marked in the file that holds them.
    assert any(note.startswith(f"{MARK}: ") for note in exported["notes"])
    files = [name for name in exported["files"] if name != "README.txt"]
    holders = [n for n in files if all(k in (out / n).read_text() for k in settings)]
    assert holders, "one file holds every default"
    for name in holders:
        if name.endswith(".json"):
            assert f"{name} holds them unmarked (JSON has no comments)" in readme
        else:
            assert f"# {MARK}: " in (out / name).read_text()


def test_a_documented_default_never_replaces_what_the_configuration_sets(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = table()["kohya"]
    clash = Row(
        ("flux",),
        ("lora",),
        # two values memory decided, otherwise; one the run already says, the same
        {"optimizer_type": "AdamW", "network_dim": 4, "sdpa": True},
        "a test",
    )
    patched = {**table(), "kohya": dataclasses.replace(entry, rows=(*entry.rows, clash))}
    monkeypatch.setattr("autofit.export.base.table", lambda: patched)
    monkeypatch.setattr("autofit.export.output.table", lambda: patched)
    out = workdir / "out"
    write_export(TARGETS["kohya"].run(point_for("kohya", FLUX, None, 4), out))
    train = tomllib.loads((out / "train.toml").read_text())  # each key once: valid TOML
    assert train["optimizer_type"] == "AdamW8bit" and train["network_dim"] == 16
    assert train["sdpa"] is True and train["learning_rate"] == 1e-4
    readme = (out / "README.txt").read_text()
    assert "  - optimizer_type=AdamW8bit: the measured configuration's, kept" in readme
    assert "  - network_dim=16: the measured configuration's, kept" in readme


# --- refusals: what a target cannot express is an error, never dropped --------------------------


@pytest.mark.parametrize(
    "target,study,point,message",
    [
        (
            "kohya",
            SANA,
            None,
            "target=kohya cannot train sana_1600m (Sana 1600M, family sana): kohya supports the families chroma, flux, sd, sd3, sdxl",
        ),
        ("sana", SANA, 6, "target=sana cannot express zero_stage=2 of sana_1600m"),
        ("sana", SANA, 4, "target=sana cannot express train_mode=lora"),
        ("simpletuner", SANA, 4, "target=simpletuner cannot express precision=bf16"),
        ("diffusers", SANA, None, "the diffusers examples train sana only as: lora"),
        ("diffusers", FLUX, 4, "target=diffusers cannot express train_mode=qlora"),
        ("kohya", FLUX, 4, "sd-scripts quantizes a base model to fp8 at most"),
        (
            "sana",
            FLUX,
            None,
            "target=sana cannot train flux_dev (FLUX.1 [dev], family flux): sana supports the families sana",
        ),
    ],
)
def test_targets_refuse_what_they_cannot_run(
    workdir: Path, target: str, study: str, point: int | None, message: str
) -> None:
    loaded = load_point(Path("results") / study / "summary.json", point)
    with pytest.raises(ConfigError, match=re.escape(message)):
        TARGETS[target].run(loaded, workdir / "out")


def test_a_knob_the_exporter_does_not_know_is_an_error(workdir: Path) -> None:
    for name, study, point, batch, _ in CASES:
        if name == "hydra":
            continue  # it writes every knob as an override; autofit probe judges them
        loaded = load_point(_summary(study), point, batch)
        loaded = dataclasses.replace(loaded, config={**loaded.config, "fp8": "on"})
        with pytest.raises(
            ConfigError, match=f"target={name} does not know the knob\\(s\\) fp8=on"
        ):
            TARGETS[name].run(loaded, workdir / "out")


def test_a_study_without_the_newer_knobs_gets_their_defaults(workdir: Path) -> None:
    summary = json.loads((workdir / "results" / SANA / "summary.json").read_text())
    old = {
        k: summary["best"]["config"][k]
        for k in ("batch_size", "resolution", "precision", "optimizer", "checkpointing")
    }
    summary["best"]["config"] = old
    (workdir / "results" / SANA / "summary.json").write_text(json.dumps(summary))
    loaded = load_point(Path("results") / SANA / "summary.json")
    assert loaded.config["zero_stage"] == 0 and loaded.config["encoders"] == "cached"
    assert list(loaded.config)[:5] == list(old)  # the study's own order first


# --- the command --------------------------------------------------------------------------------


def test_the_command_exports_the_study_named_and_prints_the_launch_command(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With two studies under results/ an export without study= does not take the newest
    (another user's search of a second ago, in a shared folder): it asks for the name and lists
    the recent studies, newest first, with model and GPU."""
    os.utime(workdir / "results" / FLUX / "summary.json", (1, 1))  # SANA is the latest
    assert main(["export", "target=accelerate"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "2 studies under results/: name the one to export with study=NAME" in err
    listed = err.split("the most recent: ", 1)[1]
    assert listed.startswith(f"{SANA} (sana_1600m on a40, written ")
    assert f"; {FLUX} (flux_dev on rtx4090, written 1970-01-01" in listed
    assert main(["export", "target=accelerate", f"study={SANA}"]) == 0
    out = workdir / "results" / SANA / "export" / "accelerate"
    printed = capsys.readouterr().out
    assert (
        f"accelerate launch --config_file {out.resolve()}/accelerate_config.yaml train.py"
        in printed
    )
    assert {p.name for p in out.iterdir()} == {
        "accelerate_config.yaml",
        "README.txt",
        "export.json",
    }
    assert "launch:" in (out / "README.txt").read_text()

    assert main(["export", "target=kohya", f"study={FLUX}", "point=3", "out=k"]) == 0
    train = tomllib.loads((workdir / "k" / "train.toml").read_text())
    assert train["blocks_to_swap"] == 24 and train["fused_backward_pass"] is True
    # Its optimizer step is fused into backward: no gradient accumulation to reach a batch of 8.
    capsys.readouterr()
    assert (
        main(["export", "target=kohya", f"study={FLUX}", "point=3", "target.global_batch=8"]) == 2
    )
    assert "fused_backward=parameter" in capsys.readouterr().err
    assert main(["export", "target=hydra", f"from=results/{FLUX}"]) == 0


def test_warnings_are_written_into_the_export_and_printed(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = json.loads((workdir / "results" / SANA / "summary.json").read_text())
    summary["pareto"][6]["config"]["attention"] = "math"
    (workdir / "results" / SANA / "summary.json").write_text(json.dumps(summary))
    assert main(["export", "target=sana", f"study={SANA}", "point=7"]) == 0
    printed = capsys.readouterr().out
    readme = (workdir / "results" / SANA / "export" / "sana" / "README.txt").read_text()
    assert "  warning  attention=math: Sana's attention runs its own kernels" in printed
    assert "  - attention=math: Sana's attention runs its own kernels" in readme


@pytest.mark.parametrize(
    "args,code,message",
    [
        (
            ["target=kohay"],
            2,
            "unknown target 'kohay' (did you mean 'kohya'?); valid targets: accelerate, deepspeed, simpletuner, kohya, musubi, ai_toolkit, onetrainer, sana, diffusers, trl, axolotl, torchtune, litgpt, llamafactory, hydra",
        ),
        ([f"study={SANA}"], 2, "no target given: add target=<name>"),
        (
            ["target=hydra", f"study={SANA}", "point=8"],
            2,
            "point=8 is not valid for study sana_1600m-a40-default: its Pareto front has rows 1..7 (counted from 1",
        ),
        (["target=hydra", f"study={SANA}", "point=0"], 2, "point=0 is not valid"),
        (
            ["target=accelerate", f"study={SANA}", "target.global_batch=100"],
            2,
            "target.global_batch=100 is not valid: it must be a multiple of the batch one step makes, 8 per GPU x 1 GPU = 8; nearest: 96 or 104",
        ),
        (
            ["target=accelerate", "study=nope"],
            2,
            "study=nope: no such study (no results/nope/summary.json); studies: flux_dev-rtx4090-default, sana_1600m-a40-default",
        ),
        (["target=accelerate", "from=elsewhere"], 2, "from=elsewhere: no such folder"),
        (["target=kohya", f"study={SANA}"], 2, "target=kohya cannot train sana_1600m"),
        (["target=accelerate", "pointt=1"], 2, "unknown setting 'pointt'"),
    ],
)
def test_bad_input_is_one_line(
    workdir: Path, capsys: pytest.CaptureFixture[str], args: list[str], code: int, message: str
) -> None:
    assert main(["export", *args]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("autofit: error: "), err
    assert message in err


def test_no_study_at_all_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["export", "target=hydra"]) == 1
    err = capsys.readouterr().err
    assert "no study found under results/" in err and err.count("\n") == 1


def test_a_study_where_nothing_fits_has_nothing_to_export(workdir: Path) -> None:
    path = workdir / "results" / SANA / "summary.json"
    summary = json.loads(path.read_text())
    summary.update(best=None, pareto=[], nothing_fits={"smallest_peak_bytes": 1})
    path.write_text(json.dumps(summary))
    with pytest.raises(AutofitError, match="has no best configuration"):
        load_point(path)


# --- paths in launch commands are quoted for the shell --------------------------------------------

# A study name (and so its results folder) with a space, a `;`, a command substitution and
# backquotes: launched, a command that interpolated it unquoted would run `touch INJECTED`.
HOSTILE = "night run; $(touch INJECTED) `touch INJECTED`"
# (target, fixed study, Pareto point, the word the launch line carries the written file's path in)
LAUNCHES = [
    ("accelerate", SANA, None, "--config_file"),
    ("deepspeed", SANA, None, "--deepspeed_config"),
    ("kohya", FLUX, 3, "--config_file"),
    ("diffusers", SANA, 4, "--config_file"),
    ("simpletuner", SANA, 6, "cp"),
    ("sana", SANA, 7, None),
    ("hydra", SANA, None, None),
]
# What each launch line runs, as a stand-in that logs its arguments one per line.
STAND_INS = ("accelerate", "deepspeed", "torchrun", "simpletuner", "autofit")


def _stand_ins(folder: Path, log: Path) -> dict[str, str]:
    """A PATH whose trainers log their argv to `log` and do nothing else."""
    folder.mkdir()
    for name in STAND_INS:
        script = folder / name
        script.write_text(f'#!/bin/sh\nprintf "%s\\n" "{name}" "$@" >> {shlex.quote(str(log))}\n')
        script.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


@pytest.mark.parametrize("target,study,point,flag", LAUNCHES, ids=[c[0] for c in LAUNCHES])
def test_a_hostile_study_name_is_quoted_in_every_launch_command(
    workdir: Path,
    capsys: pytest.CaptureFixture[str],
    target: str,
    study: str,
    point: int | None,
    flag: str | None,
) -> None:
    folder = workdir / "results" / HOSTILE
    folder.mkdir()
    summary = json.loads((workdir / "results" / study / "summary.json").read_text())
    (folder / "summary.json").write_text(json.dumps({**summary, "study": HOSTILE}))
    # Hydra's own quoting carries the name whole (its grammar stops at a bare `;`).
    args = ["export", f"target={target}", f"study='{HOSTILE}'"]
    assert main(args + ([f"point={point}"] if point else [])) == 0, capsys.readouterr().err
    out = (folder / "export" / target).resolve()
    exported = json.loads((out / "export.json").read_text())
    command = exported["command"]
    assert f"\nlaunch:\n  {command}\n" in capsys.readouterr().out  # printed as written
    words = shlex.split(command)
    if flag == "cp":
        assert f"{out}/*.json" in words
    elif flag:
        written = [n for n in exported["files"] if n.endswith((".yaml", ".json", ".toml"))]
        assert words[words.index(flag) + 1] in {str(out / n) for n in written}

    # Run it with stand-ins for the trainers: they get the paths whole, and nothing is injected.
    log, run_in = workdir / "argv.log", workdir / "launch_here"
    run_in.mkdir()
    env = _stand_ins(workdir / "bin", log)
    scripts = [["bash", "-c", command]]
    if (out / "launch.sh").exists():
        check = subprocess.run(["bash", "-n", str(out / "launch.sh")], capture_output=True)
        assert check.returncode == 0, check.stderr
        scripts.append(["sh", str(out / "launch.sh")])
    for script in scripts:
        log.unlink(missing_ok=True)
        done = subprocess.run(script, cwd=run_in, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        argv = log.read_text().splitlines()
        assert argv[0] == words[words.index(argv[0])]  # the trainer the line names
        assert argv[1:] == words[words.index(argv[0]) + 1 :]  # every word as shlex reads it
    assert not list(workdir.rglob("INJECTED")), "the launch line ran text from the study name"
    if flag == "cp":  # SimpleTuner's line copies the exported JSON files by their quoted folder
        copied = sorted(p.name for p in (run_in / "config" / "autofit").iterdir())
        assert copied == sorted(
            [*(n for n in exported["files"] if n.endswith(".json")), "export.json"]
        )
