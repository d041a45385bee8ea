"""Run by tests/onetrainer_env.py in OneTrainer's source folder: read exported configs as
OneTrainer reads them (23df3832: scripts/train.py loads a config given without a preset into
TrainConfig.default_values() with from_dict(..., migrate=True); the data loader reads the concepts
file into ConceptConfig.default_values() with from_dict, modules/dataLoader/mixin/
DataLoaderMgdsMixin.py) and print, as JSON, what they hold: each written value that the loaded
config does not hold as written, the keys no class reads, what from_dict printed (it prints a value
it cannot set instead of raising), and what the model type says of the parts, training method and
output format written.

It also applies OneTrainer's own ModuleFilter (modules/util/ModuleFilter.py, as its
LoRAModuleWrapper filters a part's modules by layer_filter) to lists of module names.

    python onetrainer_check.py REQUEST_JSON   ({"configs": [paths], "filters": [{...}]})
"""

import contextlib
import io
import json
import sys

from modules.util.config.ConceptConfig import ConceptConfig
from modules.util.config.TrainConfig import TrainConfig
from modules.util.ModuleFilter import ModuleFilter


def differences(written: dict, held: dict, where: str) -> tuple[list[str], list[str]]:
    """The keys of `written` the loaded config lacks, and those it holds otherwise."""
    unread, changed = [], []
    for key, value in written.items():
        if key == "__version":
            continue
        name = f"{where}{key}"
        if key not in held:
            unread.append(name)
        elif isinstance(value, dict) and isinstance(held[key], dict):
            more = differences(value, held[key], f"{name}.")
            unread += more[0]
            changed += more[1]
        elif held[key] != value:
            changed.append(f"{name}: wrote {value!r}, holds {held[key]!r}")
    return unread, changed


def read(path: str) -> dict:
    with open(path) as f:
        written = json.load(f)
    printed = io.StringIO()
    config = TrainConfig.default_values()
    with contextlib.redirect_stdout(printed):
        config.from_dict(json.loads(json.dumps(written)), migrate=True)
        with open(config.concept_file_name) as f:
            concepts_written = json.load(f)
        concepts = [ConceptConfig.default_values().from_dict(dict(c)) for c in concepts_written]
    unread, changed = differences(written, config.to_dict(), "")
    for i, (raw, concept) in enumerate(zip(concepts_written, concepts, strict=True)):
        more = differences(raw, concept.to_dict(), f"concepts[{i}].")
        unread += more[0]
        changed += more[1]
    model_type = config.model_type
    method = config.training_method
    parts = [
        key
        for key in written
        if key in ("unet", "transformer") or key.startswith(("text_encoder", "vae"))
    ]
    return {
        "printed": printed.getvalue(),
        "unread": unread,
        "changed": changed,
        "parts_not_of_model": [p for p in parts if p not in model_type.model_parts()],
        "method_supported": method in model_type.supported_training_methods(),
        "format_supported": config.output_model_format in model_type.supported_output_formats(method),
        "held": {
            "model_type": str(model_type), "training_method": str(method),
            "train_dtype": str(config.train_dtype), "lora_weight_dtype": str(config.lora_weight_dtype),
            "denoiser": {
                part: {
                    "weight_dtype": str(getattr(config, part).weight_dtype),
                    "gradient_checkpointing": getattr(config, part).gradient_checkpointing,
                    "offload_fraction": getattr(config, part).offload_fraction,
                }
                for part in model_type.model_parts()[:1]
            },
            "text_encoders_trained": [
                part for part in model_type.text_encoder_parts() if getattr(config, part).train
            ],
            "lora_rank": config.lora_rank, "lora_alpha": config.lora_alpha,
            "layer_filter": config.layer_filter, "layer_filter_regex": config.layer_filter_regex,
            "optimizer": {k: v for k, v in config.optimizer.to_dict().items()
                          if k in ("optimizer", "fused", "foreach", "stochastic_rounding",
                                   "is_paged", "fused_back_pass", "weight_decay")},
            "optimizer_name": str(config.optimizer.optimizer),
            "batch_size": config.batch_size,
            "gradient_accumulation_steps": config.gradient_accumulation_steps,
            "resolution": config.resolution, "latent_caching": config.latent_caching,
            "ema": str(config.ema), "learning_rate": config.learning_rate, "epochs": config.epochs,
            "sample_after_unit": str(config.sample_after_unit),
            "concept_paths": [c.path for c in concepts],
        },
    }  # fmt: skip


def selected(layer_filter: str, regex: bool, names: list[str]) -> list[str]:
    """The names LoRAModuleWrapper adapts of a part whose Linear modules are `names`."""
    filters = [ModuleFilter(pattern, use_regex=regex) for pattern in layer_filter.split(",")]
    return [name for name in names if any(f.matches(name) for f in filters)]


if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    print(json.dumps({
        "configs": [read(path) for path in request["configs"]],
        "filters": [selected(f["layer_filter"], f["layer_filter_regex"], f["names"]) for f in request["filters"]],
    }, default=str))  # fmt: skip
