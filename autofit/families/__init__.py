"""Every model family, declared once (autofit/families/base.py says what a family declares).

`REGISTRY` lists the families in the order error messages list them; a preset's `family` names
one. Nothing here imports torch: a family's workload module is imported only when it is used.

Adding a family: its workload module in autofit/workloads/, its `Family` in a module here with
its line in `REGISTRY`, its presets in conf/model/, and its tests (docs/contributing.md counts
the files). The contract tests (tests/contracts/test_family_contract.py) hold it to declare every fact,
and a trainer or a refusal for every export target that trains named families.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from autofit.errors import ConfigError, shown, suggest
from autofit.families.base import (
    COMPANION_LIBRARIES,
    TRAINERS,
    AiToolkitModel,
    AxolotlModel,
    DiffusersScript,
    DiffusersScripts,
    Family,
    KohyaScripts,
    LitGptModel,
    LlamaFactoryModel,
    MusubiScripts,
    OneTrainerModel,
    SanaScript,
    SimpleTunerModel,
    TorchtuneModel,
    Trainer,
    TrlModel,
)
from autofit.families.custom import CUSTOM
from autofit.families.flux import CHROMA, FLUX, FLUX_KONTEXT
from autofit.families.hunyuan_video import HUNYUAN_VIDEO
from autofit.families.llm import LLM
from autofit.families.mlp import MLP
from autofit.families.pixart import PIXART_SIGMA
from autofit.families.qwen_image import QWEN_IMAGE, QWEN_IMAGE_EDIT
from autofit.families.sana import SANA
from autofit.families.sd import SD
from autofit.families.sd3 import SD3
from autofit.families.sd3_controlnet import SD3_CONTROLNET
from autofit.families.sdxl import SDXL
from autofit.families.sdxl_controlnet import SDXL_CONTROLNET
from autofit.families.wan import WAN

REGISTRY: dict[str, Family] = {
    family.name: family
    for family in (
        SANA,
        PIXART_SIGMA,
        SD3,
        SD3_CONTROLNET,
        FLUX,
        CHROMA,
        FLUX_KONTEXT,
        QWEN_IMAGE,
        QWEN_IMAGE_EDIT,
        SDXL,
        SDXL_CONTROLNET,
        SD,
        WAN,
        HUNYUAN_VIDEO,
        LLM,
        CUSTOM,
        MLP,
    )
}

T = TypeVar(
    "T",
    DiffusersScripts,
    KohyaScripts,
    SimpleTunerModel,
    SanaScript,
    MusubiScripts,
    AiToolkitModel,
    OneTrainerModel,
)


def family(name: Any, where: str = "model.") -> Family:
    """The family called `name`, or a one-line ConfigError listing the valid ones; `where` says
    whose it is (the override `model.family=`, or a preset file's `conf/model/x.yaml: `)."""
    if name not in REGISTRY:
        raise ConfigError(
            f"{where}family={shown(name)} is not valid{suggest(str(name), list(REGISTRY))}; "
            f"valid families: {', '.join(REGISTRY)}"
        )
    return REGISTRY[name]


def declaring(field: str) -> list[str]:
    """The families whose declaration gives `field` a value (an interval's grouping, the
    attention modules an offload wraps), in the registry's order."""
    return [name for name, declared in REGISTRY.items() if getattr(declared, field)]


def is_causal_lm(name: str) -> bool:
    """Whether the family `name` is a transformers causal language model (Family.causal_lm)."""
    return name in REGISTRY and REGISTRY[name].causal_lm


def check_family(name: Any, where: str = "model.") -> None:
    """A one-line ConfigError unless `name` is a family (`family` says how it reads)."""
    family(name, where)


def trained_by(target: str) -> dict[str, str]:
    """The families the trainer of `target` trains, each with what it calls it (its script or
    model name), in the registry's order."""
    return {
        name: found.name
        for name, declared in REGISTRY.items()
        if (found := declared.trainer(target)) is not None
    }


def _trainer(name: str, target: str, kind: type[T]) -> T | None:
    found = REGISTRY[name].trainer(target) if name in REGISTRY else None
    assert found is None or isinstance(found, kind), f"{name}: {target} declares {found}"
    return found


def diffusers(name: str) -> DiffusersScripts | None:
    return _trainer(name, "diffusers", DiffusersScripts)


def kohya(name: str) -> KohyaScripts | None:
    return _trainer(name, "kohya", KohyaScripts)


def musubi(name: str) -> MusubiScripts | None:
    return _trainer(name, "musubi", MusubiScripts)


def ai_toolkit(name: str) -> AiToolkitModel | None:
    return _trainer(name, "ai_toolkit", AiToolkitModel)


def onetrainer(name: str) -> OneTrainerModel | None:
    return _trainer(name, "onetrainer", OneTrainerModel)


def onetrainer_part(name: str) -> str:
    """The part of OneTrainer's config that holds the family's denoiser (`transformer`, `unet`)."""
    model = onetrainer(name)
    return model.denoiser if model is not None else "transformer"


def simpletuner(name: str) -> SimpleTunerModel | None:
    return _trainer(name, "simpletuner", SimpleTunerModel)


def diffusers_script(name: str, train_mode: str) -> DiffusersScript | None:
    """The diffusers example script that trains family `name` in `train_mode`, if there is one."""
    scripts = diffusers(name)
    return scripts.scripts.get(train_mode) if scripts else None


def kohya_max_blocks_to_swap(name: str, architecture: Mapping[str, Any]) -> int | None:
    """The largest `blocks_to_swap` sd-scripts accepts for a model (None: it has no swap)."""
    scripts = kohya(name)
    if scripts is None or scripts.max_blocks_to_swap is None:
        return None
    return scripts.max_blocks_to_swap(architecture)


__all__ = [
    "COMPANION_LIBRARIES",
    "REGISTRY",
    "TRAINERS",
    "DiffusersScript",
    "DiffusersScripts",
    "Family",
    "KohyaScripts",
    "MusubiScripts",
    "SanaScript",
    "SimpleTunerModel",
    "Trainer",
    "TrlModel",
    "AxolotlModel",
    "AiToolkitModel",
    "ai_toolkit",
    "OneTrainerModel",
    "onetrainer",
    "onetrainer_part",
    "TorchtuneModel",
    "LitGptModel",
    "LlamaFactoryModel",
    "check_family",
    "declaring",
    "diffusers",
    "diffusers_script",
    "family",
    "kohya",
    "kohya_max_blocks_to_swap",
    "musubi",
    "simpletuner",
    "trained_by",
]
