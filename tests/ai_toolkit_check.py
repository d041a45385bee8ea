"""Run by tests/ai_toolkit_env.py in ai-toolkit's source folder: read exported job files as
ai-toolkit reads them (27a03a91: toolkit/config.py get_config, then the sections of its one
sd_trainer process constructed into toolkit/config_modules.py's classes as
jobs/process/BaseSDTrainProcess.py's __init__ constructs them, validate_configs, and the
optimizer toolkit/optimizer.py builds, stepped once on a tiny CPU parameter); print what they hold
as JSON, with the keys of each section that its class never reads (tests/ai_toolkit_facts.py).

    python ai_toolkit_check.py CONFIGS_JSON
"""

import json
import sys

import torch
from ai_toolkit_facts import CONFIG_MODULES, class_keys, process_keys
from extensions_built_in.sd_trainer import SDTrainerExtension
from toolkit.config import get_config
from toolkit.config_modules import (
    DatasetConfig,
    ModelConfig,
    NetworkConfig,
    SampleConfig,
    SaveConfig,
    TrainConfig,
    preprocess_dataset_raw_config,
    validate_configs,
)
from toolkit.optimizer import get_optimizer


def unread(section: dict, cls: str, keys: dict[str, set[str]]) -> list[str]:
    return sorted(set(section) - keys[cls])


def check(path: str, keys: dict[str, set[str]]) -> dict:
    config = get_config(path)
    assert config["job"] == "extension", config["job"]
    processes = config["config"]["process"]
    assert len(processes) == 1
    process = processes[0]
    assert process["type"] == SDTrainerExtension.uid, process["type"]
    # BaseSDTrainProcess.__init__, in its order
    network = NetworkConfig(**process["network"]) if "network" in process else None
    train = TrainConfig(**process.get("train", {}))
    model_raw = dict(process.get("model", {}))
    model_raw["dtype"] = train.dtype
    model = ModelConfig(**model_raw)
    save = SaveConfig(**process.get("save", {}))
    SampleConfig(**process.get("sample", {}))
    raw_datasets = preprocess_dataset_raw_config(process["datasets"])
    if train.cache_text_embeddings:
        for raw in raw_datasets:
            raw["cache_text_embeddings"] = True
    datasets = [DatasetConfig(**raw) for raw in raw_datasets]
    validate_configs(train, model, save, datasets)
    # the optimizer as its process builds it, one step on a tiny parameter
    weight = torch.nn.Parameter(torch.ones(4, 4))
    optimizer = get_optimizer(
        [weight], train.optimizer, learning_rate=train.lr, optimizer_params=train.optimizer_params
    )
    weight.grad = torch.full_like(weight, 0.5)
    optimizer.step()
    assert not torch.equal(weight.detach(), torch.ones(4, 4)), "the optimizer did not step"
    unread_keys = {
        "process": sorted(set(process) - set(process_keys())),
        "network": unread(process.get("network", {}), "NetworkConfig", keys),
        "train": unread(process.get("train", {}), "TrainConfig", keys),
        "model": unread(process.get("model", {}), "ModelConfig", keys),
        "save": unread(process.get("save", {}), "SaveConfig", keys),
        "datasets": unread(process["datasets"][0], "DatasetConfig", keys),
    }
    ema = train.ema_config
    return {
        "unread": {k: v for k, v in unread_keys.items() if v},
        "network": None if network is None else {
            "type": network.type, "linear": network.linear, "linear_alpha": network.linear_alpha,
            "network_kwargs": network.network_kwargs,
        },
        "train": {
            "dtype": train.dtype, "batch_size": train.batch_size,
            "gradient_accumulation": train.gradient_accumulation,
            "gradient_checkpointing": train.gradient_checkpointing,
            "cache_text_embeddings": train.cache_text_embeddings,
            "optimizer": type(optimizer).__module__ + "." + type(optimizer).__name__,
            "optimizer_defaults": {k: v for k, v in optimizer.defaults.items() if isinstance(v, (bool, int, float, str))},
            "lr": train.lr, "steps": train.steps, "noise_scheduler": train.noise_scheduler,
            "use_ema": ema.use_ema, "disable_sampling": train.disable_sampling,
            "train_unet": train.train_unet, "train_text_encoder": train.train_text_encoder,
        },
        "model": {
            "arch": model.arch, "is_flux": model.is_flux, "is_xl": model.is_xl,
            "is_v2": model.is_v2, "is_v_pred": model.is_v_pred, "dtype": model.dtype,
            "quantize": model.quantize, "qtype": model.qtype, "quantize_te": model.quantize_te,
            "quantize_kwargs": model.quantize_kwargs, "name_or_path": model.name_or_path,
            "assistant_lora_path": model.assistant_lora_path,
        },
        "datasets": [
            {"resolution": d.resolution, "cache_latents_to_disk": d.cache_latents_to_disk,
             "cache_text_embeddings": d.cache_text_embeddings, "folder_path": d.folder_path}
            for d in datasets
        ],
    }  # fmt: skip


if __name__ == "__main__":
    keys = class_keys(CONFIG_MODULES.read_text())
    print(json.dumps([check(path, keys) for path in json.loads(sys.argv[1])], default=str))
