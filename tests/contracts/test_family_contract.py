"""The contract of a model family (autofit/families/base.py), over every family in the registry.

Every family declares every fact or refuses it: its workload module, companions, libraries,
loader, buckets, LoRA sets, and for each export target that trains named families a trainer of
that target's kind or a `Refuse` with the reason. Every family name used anywhere (a preset, the
trainers' defaults, a search space, a comparison in autofit's code, a table of family names)
resolves to a declaration, and a preset's own trainer names are ones its family's trainers read.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from autofit.export import TARGETS
from autofit.export.defaults import table
from autofit.families import (
    COMPANION_LIBRARIES,
    REGISTRY,
    TRAINERS,
    Family,
    family,
    kohya_max_blocks_to_swap,
)
from autofit.families.base import CHECKPOINT_GROUPS, LOADERS, UNITS
from autofit.models import load_preset
from autofit.paths import group_options
from autofit.probe.libraries import OPTIONAL
from autofit.words import Refuse
from autofit.yaml_files import read_yaml

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = list(REGISTRY.values())
PRESETS = [load_preset(name) for name in group_options("model")]
# What each target reads of a preset's own `trainers` names (the rest is the family's).
PRESET_NAMES = {
    "simpletuner": {"model_flavour", "flux_fast_schedule"},
    "sana": {"config"},
    "diffusers": {"max_sequence_length"},
    "ai_toolkit": {"model.assistant_lora_path"},
    "litgpt": {"config"},
    "llamafactory": {"torch_dtype"},
}


def _ids(families: list[Family]) -> list[str]:
    return [f.name for f in families]


@pytest.mark.parametrize("declared", FAMILIES, ids=_ids(FAMILIES))
def test_every_family_declares_every_fact(declared: Family) -> None:
    assert REGISTRY[declared.name] is declared
    spec = importlib.util.find_spec(declared.workload)
    assert spec is not None and spec.origin, declared.workload
    assert "\nWORKLOAD = " in Path(spec.origin).read_text(), f"{declared.workload} sets no WORKLOAD"
    if declared.libraries is not None:
        assert set(declared.libraries) <= set(OPTIONAL) | set(COMPANION_LIBRARIES)
    assert declared.loader in LOADERS
    assert declared.unit is None or declared.unit in UNITS
    assert set(declared.feed_forward) <= {
        m for modules in declared.lora_sets.values() for m in modules
    }
    assert declared.checkpoint_groups is None or declared.checkpoint_groups in CHECKPOINT_GROUPS
    if declared.denoiser_class is not None:  # a config of that class takes the template's inputs
        assert load_preset(str(declared.config_template)).family == declared.name
    if declared.checkpoint_groups == "segments":  # a segment runs the model's loop itself
        workload = importlib.import_module(declared.workload).WORKLOAD
        assert "next_block_inputs" in {n for c in workload.__mro__[:-2] for n in vars(c)}


@pytest.mark.parametrize("declared", FAMILIES, ids=_ids(FAMILIES))
def test_every_family_names_a_trainer_or_refuses_it_for_every_target(declared: Family) -> None:
    naming = {name for name, target in TARGETS.items() if target.families is not None}
    assert naming == set(TRAINERS), "the targets that train named families are TRAINERS'"
    assert set(declared.trainers) == naming, f"{declared.name} leaves out or adds a target"
    for target, said in declared.trainers.items():
        if isinstance(said, Refuse):
            assert said.why, (declared.name, target)
        else:
            assert isinstance(said, TRAINERS[target]), (declared.name, target, said)
            assert TARGETS[target].trains(declared.name)


def test_kohya_scripts_and_diffusers_scripts_are_whole() -> None:
    for declared in FAMILIES:
        scripts = declared.trainer("diffusers")
        if scripts is not None:
            assert scripts.scripts and set(scripts.scripts) <= {"full", "lora"}  # type: ignore[union-attr]
    for preset in PRESETS:
        most = kohya_max_blocks_to_swap(preset.family, preset.architecture)
        assert most is None or 0 < most <= preset.max_swap_blocks, preset.name


@pytest.mark.parametrize("preset", PRESETS, ids=[p.name for p in PRESETS])
def test_every_preset_fits_its_family(preset) -> None:
    declared = family(preset.family, f"conf/model/{preset.name}.yaml: ")
    if declared.unit is not None:
        assert preset.unit == declared.unit
    if declared.companions is not None:
        assert set(preset.companions) <= set(declared.companions), preset.name
    for target, names in preset.trainers.items():
        assert target in PRESET_NAMES, f"{preset.name}: trainers.{target}: no target reads it"
        assert set(names) <= PRESET_NAMES[target], (preset.name, target, names)
        assert declared.trainer(target) is not None, f"{preset.name}: {target} refuses its family"


def _names_in_code() -> set[tuple[str, str]]:
    """(where, name) for each family name autofit's code compares a `.family` with, or lists in
    a table named for families."""
    found: set[tuple[str, str]] = set()
    for path in sorted((ROOT / "autofit").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            values: list[ast.expr] = []
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(
                    (isinstance(s, ast.Attribute) and s.attr == "family")
                    or (isinstance(s, ast.Name) and s.id == "family")
                    for s in sides
                ):
                    values = sides
            elif isinstance(node, ast.Assign):
                named = [t.id for t in node.targets if isinstance(t, ast.Name)]
                if any("FAMILIES" in name for name in named):
                    values = [node.value]
            for value in values:
                items = value.elts if isinstance(value, ast.Tuple | ast.List | ast.Set) else [value]
                for item in items:
                    if isinstance(item, ast.Constant) and isinstance(item.value, str):
                        found.add((f"{path.relative_to(ROOT)}:{node.lineno}", item.value))
    return found


def test_every_family_name_used_anywhere_resolves_to_a_declaration() -> None:
    used = {(f"conf/model/{p.name}.yaml", p.family) for p in PRESETS}
    for target, entry in table().items():
        for row in [*entry.rows, *entry.undocumented]:
            used |= {(f"trainer_defaults.yaml: {target}", name) for name in row.families}
    for space in sorted((ROOT / "search_spaces").glob("*.yaml")):
        data = read_yaml(space, space.name) or {}
        used |= {(space.name, name) for name in (data.get("families") or {})}
    code = _names_in_code()
    assert code, "the scan finds the family names autofit's code compares with"
    used |= code
    unknown = sorted((where, name) for where, name in used if name not in REGISTRY)
    assert not unknown, f"family names with no declaration: {unknown}"


def test_an_unknown_family_is_refused_with_the_valid_ones() -> None:
    from autofit.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        family("sanna")
    assert str(refused.value) == (
        "model.family='sanna' is not valid (did you mean 'sana'?); valid families: "
        + ", ".join(REGISTRY)
    )
