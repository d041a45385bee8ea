"""The contract of an export target (autofit/export/base.py), over every target in the registry:
it declares its name, a one-line summary, its layout and the families it trains (a trainer's
scripts) or none (one's own code, any family); it has trainer defaults or says why none are
documented; and for a preset of every family it trains, with every knob at its default (or, where the trainer cannot run that, the value a
search for it runs), it plans
files and a launch command that read every knob, and writes them. Every value of every knob
against every target: test_knob_contract.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import presets_by_family

from autofit.export import TARGETS, trainer_stack, trainer_values, write_export
from autofit.export.base import Target
from autofit.export.defaults import table
from autofit.export.point import StudyPoint
from autofit.families import REGISTRY as FAMILIES
from autofit.knobs import defaults

PRESETS = presets_by_family()


@pytest.mark.parametrize("name", list(TARGETS))
def test_every_target_declares_what_it_is(name: str) -> None:
    target = TARGETS[name]
    assert target.name == name
    assert target.summary and "\n" not in target.summary
    assert type(target).build is not Target.build, f"{name} has no layout"
    families = target.families
    if families is None:  # one's own code, or autofit's own overrides: any family
        assert target.own_code or name == "hydra"
    else:
        assert families and set(families) <= set(FAMILIES)
        assert all(families.values()), f"{name} names no script for a family"
    assert name in table(), f"{name} has no trainer defaults, nor says why"


@pytest.mark.parametrize("name", list(TARGETS))
def test_every_target_exports_the_defaults_of_every_family_it_trains(
    name: str, tmp_path: Path
) -> None:
    target = TARGETS[name]
    families = [f for f in PRESETS if target.trains(f)]
    assert families
    for family in families:
        preset = PRESETS[family]
        # every knob at its default, as a search for this trainer runs them: the values it
        # decides itself, and the first it runs of a knob whose default it cannot
        config = {**defaults(), "resolution": preset.resolution}
        config.update(trainer_stack(target, preset, {}))
        config.update({k: v[0] for k, v in trainer_values(target, preset, {}).items()})
        point = StudyPoint(
            study="contract", summary_path=Path("contract/summary.json"), preset=preset,
            gpu="a40", backend="simulate", label="best", config=config, peak_bytes=1,
            budget_bytes=2, samples_per_s=1.0,
        )  # fmt: skip
        out = tmp_path / family
        plan = target.run(point, out)  # asserts every knob read and a launch command
        assert plan.files, f"{name} wrote nothing for {family}"
        write_export(plan)
        assert {p.name for p in out.iterdir()} >= set(plan.files), (name, family)
