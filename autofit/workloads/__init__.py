"""Model families by name: a preset's `family` picks one (a plain dict; configs never name code)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from autofit.errors import ConfigError

if TYPE_CHECKING:
    from autofit.models import ModelPreset
    from autofit.workloads.base import Workload

# family -> the module that defines it (as WORKLOAD); imported only when a family is used.
FAMILIES = {
    "sana": "autofit.workloads.sana",
    "sd3": "autofit.workloads.sd3",
    "sd3_controlnet": "autofit.workloads.sd3_controlnet",
    "flux": "autofit.workloads.flux",
    "sdxl": "autofit.workloads.sdxl",
    "llm": "autofit.workloads.llm",
    "custom": "autofit.workloads.custom",
    "mlp": "autofit.workloads.mlp",
}
# What building a preset's companions (its text encoders and VAE) imports: a run that may build
# them imports these before it is built (Knob.libraries), and its probe's process keeps them.
COMPANION_LIBRARIES = ("transformers", "autofit.workloads.companions")
# family -> the optional libraries (autofit/probe/libraries.py) its workload imports, which a
# probe's process keeps; None where they are not known in advance (a user's own model code).
FAMILY_LIBRARIES: dict[str, tuple[str, ...] | None] = {
    "sana": (),
    "sd3": (),
    "sd3_controlnet": COMPANION_LIBRARIES,  # its text encoders and VAE stay resident
    "flux": (),
    "sdxl": (),
    "llm": ("transformers",),
    "custom": None,
    "mlp": (),
}


def workload_for(preset: ModelPreset) -> Workload:
    if preset.family not in FAMILIES:
        raise ConfigError(
            f"model {preset.name} names family '{preset.family}'; valid families: {', '.join(FAMILIES)}"
        )
    workload_class: type[Workload] = importlib.import_module(FAMILIES[preset.family]).WORKLOAD
    return workload_class(preset)
