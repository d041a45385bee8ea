"""Model families by name: a preset's `family` picks one (a plain dict; configs never name code)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autofit.errors import ConfigError

if TYPE_CHECKING:
    from autofit.models import ModelPreset
    from autofit.workloads.base import Workload


def _families() -> dict[str, type[Workload]]:
    from autofit.workloads.mlp import MLPWorkload
    from autofit.workloads.sana import SanaWorkload

    return {"sana": SanaWorkload, "mlp": MLPWorkload}


def workload_for(preset: ModelPreset) -> Workload:
    families = _families()
    if preset.family not in families:
        raise ConfigError(
            f"model {preset.name} names family '{preset.family}'; valid families: {', '.join(families)}"
        )
    return families[preset.family](preset)
