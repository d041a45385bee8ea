"""Model families by name: a preset's `family` picks one (a plain dict; configs never name code)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from autofit.errors import ConfigError, shown, suggest

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


def check_family(family: Any, where: str = "model.") -> None:
    """A one-line ConfigError unless `family` is one of FAMILIES; `where` says whose it is (the
    override `model.family=`, or a preset file's `conf/model/x.yaml: `)."""
    if family not in FAMILIES:
        raise ConfigError(
            f"{where}family={shown(family)} is not valid{suggest(str(family), list(FAMILIES))}; "
            f"valid families: {', '.join(FAMILIES)}"
        )


def workload_for(preset: ModelPreset) -> Workload:
    check_family(preset.family, f"model {preset.name}: ")
    workload_class: type[Workload] = importlib.import_module(FAMILIES[preset.family]).WORKLOAD
    return workload_class(preset)
