"""Run by tests/axolotl_env.py in axolotl's own environment: read exported configs as axolotl's
CLI does (axolotl/cli/config.py load_cfg, 0.19.0: its plugins, validate_config with the GPU's
capabilities, normalize_config), each with base_model a local folder, and for an FSDP config the
FSDP plugin its Trainer would get; print the results as JSON.

    python axolotl_check.py JOBS_JSON

JOBS_JSON lists {"config", "model", "n_gpu", "compute_capability"} objects: one process for all,
as importing axolotl takes most of the time.
"""

import json
import os
import sys
import tempfile
import types

import torch
import yaml
from axolotl.utils.config import normalize_config, prepare_plugins, validate_config
from axolotl.utils.dict import DictDefault


def fsdp_plugin(cfg: DictDefault) -> dict:
    """The FSDP plugin axolotl's Trainer gets for an FSDP config: axolotl's setup_fsdp_envs
    (utils/trainer.py), transformers' TrainingArguments over its fsdp_config (as core/builders/
    base.py passes it), and accelerate's FullyShardedDataParallelPlugin built from both."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    if "numba" not in sys.modules:
        # utils/trainer.py imports its sample-packing sampler, whose functions numba compiles
        # (@numba.njit) as it is imported; nothing here packs samples, so they stay Python.
        sys.modules["numba"] = types.SimpleNamespace(njit=lambda function: function)
    from axolotl.utils.trainer import setup_fsdp_envs
    from transformers import TrainingArguments

    for key in [k for k in os.environ if k.startswith(("FSDP_", "ACCELERATE_USE_FSDP"))]:
        del os.environ[key]  # one job's settings are not the next one's
    setup_fsdp_envs(cfg)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, fsdp=True, fsdp_config=cfg.fsdp_config)
    plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
    return {
        "fsdp_version": plugin.fsdp_version,
        "reshard_after_forward": plugin.reshard_after_forward,
        "cpu_offload": type(plugin.cpu_offload).__name__,
        "pin_memory": getattr(plugin.cpu_offload, "pin_memory", None),
        "auto_wrap_policy": getattr(plugin.auto_wrap_policy, "__name__", None),
        "transformer_cls_names_to_wrap": plugin.transformer_cls_names_to_wrap,
        "cpu_ram_efficient_loading": plugin.cpu_ram_efficient_loading,
        "activation_checkpointing": plugin.activation_checkpointing,
        "state_dict_type": str(plugin.state_dict_type),
    }


def check(config: str, model: str, n_gpu: int, compute_capability: str) -> dict:
    with open(config, encoding="utf-8") as file:
        cfg = DictDefault(yaml.safe_load(file))
    cfg.base_model = model  # the exported hub id, read from a local config.json instead
    prepare_plugins(cfg)
    capabilities = {
        "bf16": int(compute_capability.removeprefix("sm_")) >= 80,
        "fp8": False,
        "tf32": True,
        "n_gpu": n_gpu,
        "compute_capability": compute_capability,
    }
    environment = {"torch_version": torch.__version__.split("+")[0]}
    cfg = validate_config(cfg, capabilities=capabilities, env_capabilities=environment)
    os.environ["WORLD_SIZE"] = str(n_gpu)  # what normalize_config reads the launch from
    normalize_config(cfg)
    seen = dict(cfg)
    if cfg.fsdp_config:
        seen["fsdp_plugin"] = fsdp_plugin(cfg)
    return seen


def main() -> None:
    jobs = json.loads(sys.argv[1])
    print(json.dumps([check(**job) for job in jobs], default=str))


if __name__ == "__main__":
    main()
