"""The knobs' contract, run over the registry so a new knob or value is covered the day it is added:
every value of every knob meets every export target (the trainer's words, or a one-line refusal
naming the target, the knob, the value and what the trainer offers; never a KeyError), every run
field has one owner and hooks run after the owners of what they read, and autofit's modules import
each other without a cycle. Every knob a module declares is registered, once.
Every read of another knob's value is declared: test_knob_reads.py."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from typing import Any, get_args

import pytest
from helpers import changes_around, spec

from autofit.errors import ConfigError
from autofit.export import TARGETS, write_export
from autofit.export.base import Refused
from autofit.export.point import StudyPoint
from autofit.gpus import load_gpu
from autofit.knobs import (
    REGISTRY,
    Knob,
    Say,
    Subject,
    application_order,
    asked,
    by_name,
    defaults,
    invalid_reason,
    owners,
)
from autofit.knobs.base import Reach
from autofit.models import load_preset
from autofit.paths import group_options
from autofit.run_state import KNOB_FIELDS, RunState
from autofit.units import value as text

GPU = load_gpu("a40")
PRESETS = [load_preset(name) for name in group_options("model") if name != "custom"]


CASES = [(name, value) for name, knob in REGISTRY.items() for value in knob.sample_values()]


def _valid(config: dict[str, Any], preset: Any) -> bool:
    return invalid_reason(config, GPU, preset, "simulate") is None


def _alternatives(name: str) -> list[Any]:
    return [v for v in REGISTRY[name].sample_values() if v is not None]


def _point(preset: Any, config: dict[str, Any]) -> StudyPoint:
    return StudyPoint(
        study="contract", summary_path=Path("contract/summary.json"), preset=preset, gpu="a40",
        backend="simulate", label="best", config=config, peak_bytes=1, budget_bytes=2,
        samples_per_s=1.0,
    )  # fmt: skip


def _verdict(target: str, knob: str, preset: Any, config: dict[str, Any], out: Path) -> Any:
    """The export's verdict on a configuration: its plan, or the refusal."""
    try:
        return TARGETS[target].run(_point(preset, config), out)
    except Refused as refusal:
        return refusal


def _rank(verdict: Any, knob: str) -> int:
    """How much a verdict says about `knob`: an export (0), a refusal of `knob` itself (1), a
    refusal of another knob (2)."""
    if not isinstance(verdict, Refused):
        return 0
    return 1 if verdict.knob == knob else 2


def configuration(target: str, knob: str, value: Any, out: Path) -> tuple[Any, Any, dict]:
    """A configuration with `knob=value` that autofit can run and that says the most about it for
    `target`: the other knobs at their defaults where possible, else changed (one or two at a
    time) to values that make it valid and, where they can, that the trainer accepts."""
    families = TARGETS[target].families
    best: tuple[int, Any, Any, dict] | None = None
    for preset in PRESETS:
        if families is not None and preset.family not in families:
            continue
        try:
            TARGETS[target].check_family(preset)
        except ConfigError:  # a preset of a trained family the trainer cannot train (sd21)
            continue
        base = {**defaults(), "resolution": preset.resolution, knob: value}
        if base["resolution"] is None:
            base["resolution"] = preset.resolution
        for change in changes_around(knob, _alternatives):
            config = {**base, **change}
            if not _valid(config, preset):
                continue
            verdict = _verdict(target, knob, preset, config, out)
            rank = _rank(verdict, knob)
            if best is None or rank < best[0]:
                best = (rank, preset, verdict, config)
            if rank == 0 or (rank == 1 and not change):
                return preset, verdict, config
    if best is None:
        pytest.skip(f"no model autofit can run {knob}={text(value)} with, for {target}")
    return best[1], best[2], best[3]


@pytest.mark.long
@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("knob,value", CASES, ids=[f"{k}={text(v)}" for k, v in CASES])
def test_every_value_of_every_knob_meets_every_target(
    target: str, knob: str, value: Any, tmp_path: Path
) -> None:
    preset, verdict, config = configuration(target, knob, value, tmp_path / "out")
    if isinstance(verdict, Refused):
        message = str(verdict)
        assert "\n" not in message
        assert message.startswith(f"target={target} cannot express {verdict.knob}=")
        assert f"{verdict.knob}={text(config[verdict.knob])}" in message
        assert f"; {target} offers " in message and verdict.offers
        return
    write_export(verdict)
    written = "\n".join(p.read_text() for p in (tmp_path / "out").iterdir()) + verdict.command
    subject = Subject(config, preset, 1, tmp_path / "out")
    declared = REGISTRY[knob]
    if target == "hydra":  # autofit's own overrides: every knob that asks something
        listed = f"- {knob}={text(config[knob])}\n" in written
        assert listed == (knob in asked(config, preset)), written  # the others: its defaults
        return
    if knob in verdict.written_by_layout:  # the batch in a dataset file, the GPUs in the command
        assert text(config[knob]) in written
        return
    words = declared.express(
        TARGETS[target].vocabulary, config[knob], subject, TARGETS[target].own_code
    )
    assert isinstance(words, Say)  # what the export did not refuse, the knob's words say
    for key in words.settings:  # each of the trainer's settings is written somewhere
        assert key.rsplit(".", 1)[-1].lstrip("-") in written, f"{target} lost {key} of {knob}"
    if words.note:
        assert words.note in verdict.notes
    if words.warning:
        assert any(w.endswith(words.warning) for w in verdict.warnings)


# --- the declarations themselves ----------------------------------------------------------------


@pytest.mark.parametrize("name", list(REGISTRY))
def test_each_knob_declares_what_it_is(name: str) -> None:
    knob = REGISTRY[name]
    assert knob.name == name and knob.help
    assert knob.reach in get_args(Reach)
    assert knob.parse(knob.default) == knob.default
    subject = Subject(defaults(), PRESETS[0])
    for value in knob.sample_values():
        if value is not None:
            assert knob.parse(value) == value
            assert knob.means(value, subject)  # what one's own training code must do
    for vocabulary, words in knob.trainers.items():
        assert vocabulary in {t.vocabulary for t in TARGETS.values()}, f"{name}: {vocabulary}?"
        if isinstance(words, dict):  # a table names only values the knob has
            assert set(words) <= set(knob.choices or ()), f"{name}'s {vocabulary} words"
    with pytest.raises(ConfigError, match=f"^{name}="):
        knob.parse("no such value" if knob.kind is not str else 12345)


def test_every_knob_a_module_declares_is_registered_once() -> None:
    """A knob class with a name in any module of autofit/knobs is in the registry (a module
    added without its line there would be silently unused), and a second knob of a name already
    taken is refused rather than replacing the first."""
    package = Path(inspect.getfile(Knob)).parent
    names = [p.stem for p in package.glob("*.py")]
    names += [f"{p.name}.{f.stem}" for p in package.iterdir() for f in p.glob("*.py")]
    for name in sorted(n.removesuffix(".__init__") for n in names):
        module = importlib.import_module(f"autofit.knobs.{name}")
        for _, declared in inspect.getmembers(module, inspect.isclass):
            if issubclass(declared, Knob) and declared.__module__ == module.__name__:
                if "name" in vars(declared):  # a base class (AdapterFileKnob) names none
                    registered = REGISTRY.get(declared.name)
                    assert type(registered) is declared, f"{declared.__name__} is not registered"
    with pytest.raises(AssertionError, match="two knobs are named batch_size"):
        by_name([REGISTRY["batch_size"], REGISTRY["resolution"], REGISTRY["batch_size"]])


def test_every_run_field_has_one_owner_and_every_read_field_is_written() -> None:
    found = owners()
    assert set(found) == set(KNOB_FIELDS)
    for knob in REGISTRY.values():
        assert set(knob.reads) <= set(KNOB_FIELDS), knob.name
        assert set(knob.after) <= set(REGISTRY), knob.name


def test_hooks_run_after_the_owners_of_what_they_read() -> None:
    order = [k.name for k in application_order()]
    assert sorted(order) == sorted(REGISTRY)
    found = owners()
    for knob in REGISTRY.values():
        for field in knob.reads:
            assert order.index(found[field]) < order.index(knob.name), (knob.name, field)
        for first in knob.after:
            assert order.index(first) < order.index(knob.name), (knob.name, first)
    # The constraints alone order them: listed the other way round, they still hold.
    backwards = dict(reversed(list(REGISTRY.items())))
    reordered = [k.name for k in application_order(backwards)]
    for knob in REGISTRY.values():
        for field in knob.reads:
            assert reordered.index(found[field]) < reordered.index(knob.name)


def test_a_cycle_of_constraints_is_refused() -> None:
    class First(Knob):
        name, default, help, values = "first", "a", "one", {"a": "a"}
        reads, writes = ("optimizer",), ("stepper",)

    class Second(Knob):
        name, default, help, values = "second", "a", "two", {"a": "a"}
        reads, writes = ("stepper",), ("optimizer",)

    with pytest.raises(AssertionError, match="cycle"):
        application_order({"first": First(), "second": Second()})


def test_a_hook_that_writes_a_field_it_does_not_own_fails() -> None:
    run = RunState(spec("tiny_mlp"), workload=None, device=None, owners=owners())
    with run.applying("ema"):
        run.after_step = None  # its own
        with pytest.raises(
            AssertionError, match="knob ema wrote run.optimizer, which knob optimizer owns"
        ):
            run.optimizer = object()
        with pytest.raises(
            AssertionError, match="knob ema wrote run.model, which the run itself owns"
        ):
            run.model = object()
    run.optimizer = object()  # outside a hook the run sets its own fields


# --- the import graph ---------------------------------------------------------------------------


def _imports(root: Path) -> dict[str, set[str]]:
    """autofit's modules and the autofit modules each imports, every import counted: module-level,
    function-level and TYPE_CHECKING (as ../shared/tools/import_cycles.py counts them)."""
    modules = {}
    for path in (root / "autofit").rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = module.split(".") if package else module.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in node.names
                ]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != module:
                    edges[module].add(target)
    return edges


def test_no_import_cycle_among_autofits_modules() -> None:
    edges = _imports(Path(__file__).resolve().parents[2])
    cycles = []
    for start in edges:  # a module that reaches itself is in a cycle
        seen, stack = set(), list(edges[start])
        while stack:
            node = stack.pop()
            if node == start:
                cycles.append(start)
                break
            if node not in seen:
                seen.add(node)
                stack.extend(edges[node])
    assert not cycles, f"modules in an import cycle: {', '.join(sorted(cycles))}"
