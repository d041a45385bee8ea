"""Run by tests/axolotl_env.py in axolotl's own environment: read exported configs as axolotl's
CLI does (axolotl/cli/config.py load_cfg, 0.19.0: its plugins, validate_config with the GPU's
capabilities, normalize_config), each with base_model a local folder; print the results as JSON.

    python axolotl_check.py JOBS_JSON

JOBS_JSON lists {"config", "model", "n_gpu", "compute_capability"} objects: one process for all,
as importing axolotl takes most of the time.
"""

import json
import os
import sys

import torch
import yaml
from axolotl.utils.config import normalize_config, prepare_plugins, validate_config
from axolotl.utils.dict import DictDefault


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
    return dict(cfg)


def main() -> None:
    jobs = json.loads(sys.argv[1])
    print(json.dumps([check(**job) for job in jobs], default=str))


if __name__ == "__main__":
    main()
