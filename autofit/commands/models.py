"""`autofit models`: the presets, with their parameter counts counted from the architectures
(built on fake tensors: nothing is allocated or downloaded) next to the published figures."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from autofit.config import compose_config
from autofit.families import REGISTRY as FAMILIES
from autofit.knobs.frames import native_frames
from autofit.models import ModelPreset, load_preset
from autofit.paths import group_options, write_atomically
from autofit.settings import TEXT, built, setting
from autofit.units import count
from autofit.workloads import workload_for


@dataclasses.dataclass(frozen=True)
class ModelsSettings:
    """`autofit models`'s one setting (conf/models.yaml)."""

    out: str | None = setting(None, TEXT.or_null())


def count_parameters() -> list[dict[str, Any]]:
    """Every preset's trained model and companions, counted."""
    # torch (seconds to import) only once the settings are checked: `autofit models out=[1]`
    # answers at once.
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autofit.workloads.companions import build_companion  # imports torch

    presets = [load_preset(name) for name in group_options("model") if name != "custom"]
    workloads = {
        preset.name: workload_for(preset) for preset in presets
    }  # imports, outside fake mode
    rows = []
    counted: dict[str, int] = {}  # presets share companions (T5, the CLIPs, VAEs): count each once

    def companion_params(spec: dict[str, Any]) -> int:
        key = json.dumps(spec, sort_keys=True)
        if key not in counted:
            counted[key] = sum(p.numel() for p in build_companion(spec).parameters())
        return counted[key]

    with FakeTensorMode(allow_non_fake_inputs=True):
        for preset in presets:
            model = workloads[preset.name].build_model(torch.bfloat16)
            companions = {role: companion_params(spec) for role, spec in preset.companions.items()}
            rows.append(
                {
                    "model": preset.name,
                    "family": preset.family,
                    "display": preset.display,
                    "params": sum(p.numel() for p in model.parameters()),
                    "published_params_b": preset.published_params_b,
                    "native": native_size(preset),
                    "companions": {
                        role: {
                            "params": n,
                            "published_params_b": preset.companions[role].get("published_params_b"),
                        }
                        for role, n in companions.items()
                    },  # fmt: skip
                }
            )
    return rows


def native_size(preset: ModelPreset) -> str:
    """A preset's native sample in its unit: tokens, an image's pixels, or a clip's frames too."""
    if preset.unit == "tokens":
        return f"{preset.resolution} tokens"
    if FAMILIES[preset.family].video:
        height, width = preset.shape(preset.resolution)
        return f"{height}x{width} px, {native_frames(preset)} frames"
    return f"{preset.resolution} px"


def run(overrides: list[str]) -> int:
    return run_config(compose_config("models", overrides))


def run_config(cfg: Any) -> int:
    settings = built(ModelsSettings, cfg)
    rows = count_parameters()
    _render(rows)
    return _written(rows, Path(settings.out) if settings.out else Path("results") / "models.json")


def _render(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'model':<17} {'family':<15} {'params':>10} {'published':>10}  {'native':<24} companions"
    )
    for row in rows:
        published = f"{row['published_params_b']:.3f} B" if row["published_params_b"] else "-"
        companions = ", ".join(
            f"{role} {count(c['params'])}" for role, c in row["companions"].items()
        )
        print(
            f"{row['model']:<17} {row['family']:<15} {count(row['params']):>10} {published:>10}  {row['native']:<24} {companions}"
        )
    print(
        "\nmodel=path/to/config.json (or its folder, or model=hf:org/name from the local Hugging "
        "Face cache) trains any causal language model transformers has, from its config, or a "
        "diffusers model of a family above (its transformer's config; docs/models.md)"
    )
    print(
        "model=custom model.entry=package.module:function trains your own model (see docs/models.md)"
    )


def _written(rows: list[dict[str, Any]], out: Path) -> int:
    """The table as JSON in `out`; a read-only checkout only warns (the table is printed)."""
    try:
        write_atomically(out, json.dumps(rows, indent=2))
    except OSError as exc:  # a read-only checkout: the table above is the answer; say so
        print(
            f"autofit: warning: the table is not written to {out} ({exc.strerror or exc}); "
            "add out=PATH to write it somewhere else",
            file=sys.stderr,
        )
        return 0
    print(f"written to {out}")
    return 0
