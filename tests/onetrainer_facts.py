"""What OneTrainer's source at the pinned commit accepts in a training config and a concepts
file, as names only: read from its source folder (tests/onetrainer_env.py builds it) and printed
as JSON, the facts tests/fixtures/export/onetrainer_23df3832.json holds for the tests that run
without a clone.

    python onetrainer_facts.py COMMIT   (in that folder, with its PYTHONPATH; onetrainer_env.facts())

A config class declares its fields as data (`default_values()`: each name with its type), and
ModelType's methods say which parts, training methods and output formats a model type has: both
are read by importing the classes, not from their syntax.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Any, get_args, get_origin

from modules.util.config.BaseConfig import BaseConfig
from modules.util.config.ConceptConfig import ConceptConfig
from modules.util.config.TrainConfig import TrainConfig
from modules.util.enum.ModelType import ModelType
from modules.util.enum.TrainingMethod import TrainingMethod

SCALARS = {bool: "bool", int: "int", float: "float", str: "str"}


def _kind(declared: Any) -> str:
    """What a field holds, in words: a scalar type, a sub-config's class, an enum's, a list."""
    if isinstance(declared, type) and issubclass(declared, BaseConfig):
        return f"config:{declared.__name__}"
    if isinstance(declared, type) and issubclass(declared, Enum):
        return f"enum:{declared.__name__}"
    if declared in SCALARS:
        return SCALARS[declared]
    origin = get_origin(declared) or declared
    args = [a.__name__ for a in get_args(declared) if isinstance(a, type)]
    return f"{origin.__name__}[{','.join(args)}]" if args else origin.__name__


def _classes(root: BaseConfig) -> dict[str, dict[str, str]]:
    """Each config class reachable from `root` through its sub-configs: its fields' kinds."""
    found: dict[str, dict[str, str]] = {}
    pending = [root]
    while pending:
        config = pending.pop()
        name = type(config).__name__
        if name in found:
            continue
        found[name] = {field: _kind(declared) for field, declared in config.types.items()}
        pending += [
            getattr(config, field)
            for field, declared in config.types.items()
            if isinstance(declared, type) and issubclass(declared, BaseConfig)
        ]
    return found


def _enums(classes: dict[str, dict[str, str]]) -> dict[str, list[str]]:
    """The member names of every enum a field names (BaseConfig.from_dict reads them by name)."""
    modules = {c.__name__: c for c in Enum.__subclasses__() if c.__module__.startswith("modules.")}
    named = {
        kind.split(":")[1]
        for fields in classes.values()
        for kind in fields.values()
        if kind.startswith("enum:")
    }
    return {name: [member.name for member in modules[name]] for name in sorted(named)}


def _model_types() -> dict[str, Any]:
    out = {}
    for model_type in ModelType:
        try:
            methods = model_type.supported_training_methods()
        except ValueError:  # a model type OneTrainer declares no method for
            methods = ()
        out[model_type.name] = {
            "parts": list(model_type.model_parts()),
            "training_methods": [m.name for m in methods],
            "output_formats": {
                m.name: [f.name for f in model_type.supported_output_formats(m)]
                for m in methods
                if m in (TrainingMethod.LORA, TrainingMethod.FINE_TUNE)
            },
        }
    return out


def facts(commit: str) -> dict[str, Any]:
    train = TrainConfig.default_values()
    classes = {**_classes(train), **_classes(ConceptConfig.default_values())}
    return {
        "_source": f"Nerogar/OneTrainer at {commit}: names read from its source by "
        "tests/onetrainer_facts.py (regenerate: AUTOFIT_REGENERATE_GOLDEN=1 pytest -m long "
        "tests/test_export_onetrainer.py -k facts, with a clone)",
        "config_version": train.config_version,
        "concept_version": ConceptConfig.default_values().config_version,
        "classes": classes,
        "enums": _enums(classes),
        "model_types": _model_types(),
    }


if __name__ == "__main__":
    print(json.dumps(facts(sys.argv[1]), indent=1, sort_keys=True))
