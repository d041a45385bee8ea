"""A model from its Hugging Face config, nothing downloaded: `model=path/to/config.json`, a folder
holding one (as `save_pretrained` writes it), or `model=hf:org/name`, read from the local Hugging
Face cache only (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub).

A causal language model of any architecture the installed transformers has becomes a preset of
the `llm` family, its random weights built by transformers from the config as it stands (its
`model_type` picks the classes). What a preset file states besides the architecture is read off
the model built on the meta device: the block list (the module list holding most parameters)
and the linear layers LoRA adapts (every one in the blocks, as PEFT's `all-linear`).

A diffusers config (`_class_name`: its folder's, or a pipeline folder's `transformer/`) builds a
model of the family that declares that class (`denoiser_class`), whose inputs (latents, text,
clips), companions, buckets and LoRA targets are its `config_template` preset's: a Wan 14B config
takes the 1.3B preset's. A class no family declares is refused in one line naming those there are.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from autofit.errors import ConfigError
from autofit.families import REGISTRY
from autofit.models import is_size, load_preset

HF_PREFIX = "hf:"
CONFIG_NAME = "config.json"
# Where a diffusers pipeline's folder keeps its trained model's config (a video or image
# pipeline as `save_pretrained` and the Hub lay it out).
DENOISER_CONFIG = ("transformer", CONFIG_NAME)
# What save_pretrained writes beside the architecture: how the weights were stored and by whom.
NOT_ARCHITECTURE = (
    "architectures", "transformers_version", "torch_dtype", "dtype", "_name_or_path", "auto_map",
    "quantization_config", "use_cache",
)  # fmt: skip
DEFAULT_TOKENS = 4096  # the sequence length a preset probes by default, as the shipped presets


def is_model_file(value: Any) -> bool:
    """Whether `model=<value>` names a config of the user's rather than a shipped preset."""
    if not isinstance(value, str):
        return False
    folder = Path(value).expanduser()
    return (
        value.startswith(HF_PREFIX)
        or value.endswith(".json")
        or (folder / CONFIG_NAME).is_file()
        or folder.joinpath(*DENOISER_CONFIG).is_file()
    )


def hub_cache() -> Path:
    """Where huggingface_hub keeps downloaded repositories on this machine."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".cache" / "huggingface") / "hub"


def _cached(repo: str) -> Path:
    """config.json of `repo` in the local cache: the snapshot refs/main names, else the newest."""
    folder = hub_cache() / f"models--{repo.replace('/', '--')}"
    ref = folder / "refs" / "main"
    snapshots = [folder / "snapshots" / ref.read_text().strip()] if ref.is_file() else []
    snapshots += sorted(
        (folder / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for snapshot in snapshots:
        for config in (snapshot / CONFIG_NAME, snapshot.joinpath(*DENOISER_CONFIG)):
            if config.is_file():
                return config
    raise ConfigError(
        f"model=hf:{repo}: its {CONFIG_NAME} is not in the local Hugging Face cache (looked in "
        f"{folder}); autofit downloads nothing: fetch it with `hf download {repo} "
        f"{CONFIG_NAME}`, or give model=path/to/{CONFIG_NAME}"
    )


def config_path(value: str) -> Path:
    """The config file `model=<value>` names, or a ConfigError saying where it looked."""
    if value.startswith(HF_PREFIX):
        repo = value[len(HF_PREFIX) :]
        if repo.count("/") != 1 or not all(repo.split("/")):
            raise ConfigError(f"model={value} is not valid; write model=hf:org/name")
        return _cached(repo)
    path = Path(value).expanduser()
    if path.is_dir():
        folder, path = path, path / CONFIG_NAME
        if not path.is_file() and folder.joinpath(*DENOISER_CONFIG).is_file():
            path = folder.joinpath(*DENOISER_CONFIG)  # a diffusers pipeline's folder
    if not path.is_file():
        raise ConfigError(
            f"model={value}: no such file (a model's {CONFIG_NAME}, or the folder holding one, "
            f"relative to {Path.cwd()}; or model=hf:org/name from the local Hugging Face cache)"
        )
    return path


def read_config(value: str, path: Path) -> dict[str, Any]:
    """The config at `path` (config_path(value)), or a ConfigError naming it."""
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"model={value}: {path} is not a JSON file ({exc})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"model={value}: {path} holds no config mapping")
    return config


def _name(value: str) -> str:
    """A preset name for the config: the repository's or folder's name, as a preset is named."""
    if value.startswith(HF_PREFIX):
        stem = value.split("/")[-1]
    else:
        path = Path(value).expanduser()
        stem = (
            path.name if path.is_dir() else path.parent.name if path.stem == "config" else path.stem
        )
    return re.sub(r"[^a-z0-9_]+", "_", stem.lower()).strip("_") or "model"


def _diffusers_entry(value: str, path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """A diffusers denoiser's config as a preset of the family that declares its class."""
    name = config["_class_name"]
    families = {f.denoiser_class: f for f in REGISTRY.values() if f.denoiser_class}
    if name not in families:
        known = ", ".join(f"{c} ({f.name})" for c, f in families.items())
        raise ConfigError(
            f"model={value}: a diffusers {name} config, which no family of autofit's builds; "
            f"the classes it builds from a config: {known}; or a causal language model's config"
        )
    family = families[name]
    template = load_preset(str(family.config_template))
    architecture = {
        key: v
        for key, v in config.items()
        # diffusers' own bookkeeping; and a size set to none, which the class's default is too
        if not key.startswith("_") and not (v is None and is_size(key))
    }
    entry = template.to_dict()
    label = _name(value)
    entry.update(
        name=label,
        display=f"{label} ({name}, from {value})",
        architecture=architecture,
        published_params_b=None,
        weights=value[len(HF_PREFIX) :] if value.startswith(HF_PREFIX) else None,
        notes=f"built from {path}; inputs, companions and buckets as {template.name}'s",
    )
    if len(template.blocks) == 1 and "num_layers" in architecture:
        # as many blocks kept on the GPU as the template keeps, whatever the depth
        kept = int(template.architecture["num_layers"]) - template.max_swap_blocks
        entry["max_swap_blocks"] = max(int(architecture["num_layers"]) - kept, 0)
    return entry


def _read_off(kind: str, architecture: dict[str, Any]) -> tuple[str, list[str], int, int]:
    """The block list's path, the linear layers' names in it, their count and the parameters,
    read off the model built on the meta device by the classes the probe builds it with."""
    import torch

    # lazy: transformers only where a model's classes are read, not for a preset from a file
    from autofit.workloads.llm import causal_lm_classes

    config_class, model_class = causal_lm_classes(kind)
    with torch.device("meta"):
        model = model_class(config_class(**architecture))
    lists = [
        (sum(p.numel() for p in module.parameters()), path, module)
        for path, module in model.named_modules()
        if isinstance(module, torch.nn.ModuleList) and len(module)
    ]
    if not lists:
        raise ConfigError(f"model_type {kind!r}: no list of blocks found in its model")
    _, path, blocks = max(lists, key=lambda entry: entry[0])
    linears = sorted(
        {
            name.split(".")[-1]
            for name, m in blocks.named_modules()
            if isinstance(m, torch.nn.Linear)
        }
    )
    return path, linears, len(blocks), sum(p.numel() for p in model.parameters())


def preset_entry(value: str) -> dict[str, Any]:
    """The preset fields of the model `model=<value>` names (ModelPreset.from_dict checks them)."""
    path = config_path(value)
    config = read_config(value, path)
    if "_class_name" in config:
        return _diffusers_entry(value, path, config)
    kind = config.get("model_type")
    if not isinstance(kind, str):
        raise ConfigError(f"model={value}: its config names no model_type")
    architecture = {k: v for k, v in config.items() if k not in NOT_ARCHITECTURE}
    architecture.pop("model_type")
    blocks, linears, layers, params = _read_off(kind, architecture)
    name = _name(value)
    tokens = config.get("max_position_embeddings") or DEFAULT_TOKENS
    return {
        "name": name,
        "family": "llm",
        "display": f"{name} ({kind}, {params / 1e9:.2f} B parameters, from {value})",
        "unit": "tokens",
        "resolution": min(int(tokens), DEFAULT_TOKENS),
        "architecture": {"kind": kind, "config": architecture},
        "lora_targets": linears,
        "blocks": [blocks],
        "max_swap_blocks": max(layers - 2, 0),
        "weights": value[len(HF_PREFIX) :] if value.startswith(HF_PREFIX) else None,
        "notes": f"built from {path}"
        + (
            "; its quantization_config is left out: the base's storage is what train_mode and "
            "base_precision say"
            if "quantization_config" in config
            else ""
        ),
    }
