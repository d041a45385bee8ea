"""Exporters: the best configuration of a study (or any Pareto point), in each trainer's own files.

`TARGETS` is the registry: a target's name to its `Target` (autofit/export/base.py says what a
target must do). `export` plans one export and writes it. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autofit.config import suggest
from autofit.errors import ConfigError
from autofit.export.accelerate import TARGET as ACCELERATE
from autofit.export.ai_toolkit import TARGET as AI_TOOLKIT
from autofit.export.axolotl import TARGET as AXOLOTL
from autofit.export.base import ExportPlan, Refused, Target
from autofit.export.deepspeed import TARGET as DEEPSPEED
from autofit.export.diffusers import TARGET as DIFFUSERS
from autofit.export.hydra import TARGET as HYDRA
from autofit.export.kohya import TARGET as KOHYA
from autofit.export.litgpt import TARGET as LITGPT
from autofit.export.llamafactory import TARGET as LLAMAFACTORY
from autofit.export.musubi import TARGET as MUSUBI
from autofit.export.onetrainer import TARGET as ONETRAINER
from autofit.export.output import readme, write_export
from autofit.export.point import StudyPoint, load_point
from autofit.export.sana import TARGET as SANA
from autofit.export.simpletuner import TARGET as SIMPLETUNER
from autofit.export.torchtune import TARGET as TORCHTUNE
from autofit.export.trl import TARGET as TRL
from autofit.gpus import GpuSpec
from autofit.knobs import REGISTRY, defaults
from autofit.knobs.base import ProbeContext, Refuse, Subject
from autofit.models import ModelPreset

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        ACCELERATE,
        DEEPSPEED,
        SIMPLETUNER,
        KOHYA,
        MUSUBI,
        AI_TOOLKIT,
        ONETRAINER,
        SANA,
        DIFFUSERS,
        TRL,
        AXOLOTL,
        TORCHTUNE,
        LITGPT,
        LLAMAFACTORY,
        HYDRA,
    )
}


def target(name: object, setting: str = "target") -> Target:
    """The target called `name`, or a ConfigError listing the valid ones."""
    valid = ", ".join(TARGETS)
    if name is None:
        raise ConfigError(f"no target given: add {setting}=<name>; valid targets: {valid}")
    if name not in TARGETS:
        hint = suggest(str(name), list(TARGETS))
        raise ConfigError(f"unknown {setting} '{name}'{hint}; valid targets: {valid}")
    return TARGETS[str(name)]


def unlaunchable(chosen: Target, preset: ModelPreset, config: dict[str, Any]) -> str | None:
    """Why `chosen` cannot launch this configuration as it would be measured (one line: the
    knob, the value, why, what the trainer offers), or None. Knobs left out are at default."""
    point = StudyPoint(
        study="", summary_path=Path("summary.json"), preset=preset, gpu="", backend="",
        label="a candidate", config={**defaults(), **config}, peak_bytes=0, budget_bytes=0,
        samples_per_s=0.0,
    )  # fmt: skip
    try:
        chosen.run(point, Path("."))
    except Refused as refusal:
        return refusal.short
    return None


def trainer_stack(
    chosen: Target, preset: ModelPreset, searched: Mapping[str, tuple[Any, ...]]
) -> dict[str, Any]:
    """The knobs `chosen` decides itself that a search for it simulates as that trainer runs
    them (the first value it runs when told nothing), where autofit's default is one it cannot
    run as measured: the diffusers scripts' AdamW is torch's foreach, which holds a temporary
    the size of the trained weights that autofit's fused default does not. Knobs the space
    searches are left to it; the words are judged on the space's first values."""
    subject = Subject({**defaults(), **{k: v[0] for k, v in searched.items()}}, preset)
    own = {
        name: knob.trainers_own_value(chosen.vocabulary, subject, chosen.own_code)
        for name, knob in REGISTRY.items()
        if name not in searched
    }
    return {name: value for name, value in own.items() if value is not None}


def trainer_values(
    chosen: Target,
    preset: ModelPreset,
    searched: Mapping[str, tuple[Any, ...]],
    gpu: GpuSpec | None = None,
) -> dict[str, tuple[Any, ...]]:
    """For each knob of which `chosen` runs none of the values the space gives it (those it
    searches, or the default of one it leaves out), the values it does run (in the knob's
    order): a search for a trainer then searches what that trainer can launch rather than
    nothing (SimpleTuner trains in bf16 or fp32 weights, never under mixed bf16 with fp32
    masters; diffusers' example scripts train Sana only as LoRA, and keep Flux's text encoders
    on the GPU). A knob left out that the trainer decides itself, asking nothing, is
    `trainer_stack`'s. Judged on the space's first values of the other knobs, those replaced
    included: a value that only matters once another is replaced (the LoRA modules of a trainer
    that trains LoRA only) is judged again with it. On `gpu`, only the values it can run count
    (ai-toolkit trains LoRA in bf16 or fp32: on a card without bf16, fp32 in place of the
    space's fp16, which it refuses)."""
    replaced: dict[str, tuple[Any, ...]] = {}
    for _ in REGISTRY:  # each round replaces a knob at least, or ends
        found = _trainer_values(chosen, preset, {**searched, **replaced}, gpu)
        if not found:
            break
        replaced.update(found)
    return replaced


def _trainer_values(
    chosen: Target,
    preset: ModelPreset,
    searched: Mapping[str, tuple[Any, ...]],
    gpu: GpuSpec | None,
) -> dict[str, tuple[Any, ...]]:
    given = {**{k: (v,) for k, v in defaults().items()}, **searched}
    given["resolution"] = (preset.resolution,)  # the planner's, not a knob's values to judge
    subject = Subject({k: v[0] for k, v in given.items()}, preset)

    def on_card(name: str, value: Any) -> bool:
        if gpu is None:
            return True
        context = ProbeContext({**subject.config, name: value}, gpu, preset, "simulate")
        return REGISTRY[name].invalid_reason(value, context) is None

    replaced = {}
    for name, values in given.items():
        knob = REGISTRY[name]
        if name in ("batch_size", "resolution"):
            continue
        if name not in searched and (
            # trainer_stack's: the one value the trainer runs when told nothing
            knob.trainers_own_value(chosen.vocabulary, subject, chosen.own_code) is not None
            # its default runs: nothing to replace
            or not isinstance(
                knob.express(chosen.vocabulary, values[0], subject, chosen.own_code), Refuse
            )
        ):
            continue
        runs = tuple(
            v for v in knob.runs(chosen.vocabulary, subject, chosen.own_code) if on_card(name, v)
        )
        if runs and not {v for v in values if on_card(name, v)} & set(runs):
            replaced[name] = runs
    return replaced


__all__ = [
    "TARGETS",
    "ExportPlan",
    "StudyPoint",
    "Target",
    "load_point",
    "target",
    "trainer_stack",
    "trainer_values",
    "unlaunchable",
    "readme",
    "write_export",
]
