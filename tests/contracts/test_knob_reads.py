"""Every read of another knob's value is declared: a knob lists in `depends_on` each knob whose value
its rules, trainers' words and hooks look at. Held twice: in the source (every literal read of
`knobs[...]`, `knobs.get(...)`, `config[...]` and `config.get(...)` in a knob's module, keys that
loop over a table of knob names included) and as the code runs (every knob's rules and words,
over every value of every knob on a model of every family, with a configuration that records what
is read: reads in helpers of other modules are caught there)."""

from __future__ import annotations

import ast
import importlib
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import presets_by_family

from autofit.export import TARGETS
from autofit.families import REGISTRY as FAMILIES
from autofit.gpus import load_gpu
from autofit.knobs import REGISTRY, Knob, ProbeContext, Subject, defaults
from autofit.units import value as text

KNOBS_DIR = Path(inspect.getfile(Knob)).parent
GPU = load_gpu("a40")
# One preset of each family: what a rule reads can depend on the family.
PRESETS = [p for family, p in presets_by_family().items() if family in FAMILIES]
SOURCES = ("knobs", "config")  # context.knobs, run.knobs, subject.config, a config argument


def _knobs_of(module: str) -> list[Knob]:
    """The registered knobs whose class, or a class it inherits, is defined in `module`."""
    return [
        knob
        for knob in REGISTRY.values()
        if any(c.__module__ == module for c in type(knob).__mro__ if c is not Knob)
    ]


def _modules() -> list[str]:
    """Each knob's module: a file of autofit/knobs, or a package there (the knob in its
    __init__, its trainers' words in modules beside it)."""
    files = [p.stem for p in KNOBS_DIR.glob("*.py") if p.stem not in ("__init__", "base")]
    packages = [p.name for p in KNOBS_DIR.iterdir() if (p / "__init__.py").is_file()]
    return [f"autofit.knobs.{name}" for name in sorted(files + packages)]


def _files(module: str) -> list[tuple[Path, str]]:
    """The source files of a knob's module, each with the module it is: a package's every file."""
    name = module.rsplit(".", 1)[1]
    if (KNOBS_DIR / name).is_dir():
        return [
            (path, module if path.stem == "__init__" else f"{module}.{path.stem}")
            for path in sorted((KNOBS_DIR / name).glob("*.py"))
        ]
    return [(KNOBS_DIR / f"{name}.py", module)]


def _source(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _literal_reads(module: str) -> Iterator[tuple[str, int]]:
    """(knob name, line) for every read of a knob's value in `module`'s source. A key that is not
    a literal must be a loop variable over a table whose knob names can be found (a literal, or a
    name bound to one or to knobs); anything else fails, as a read no declaration can cover."""
    for path, name in _files(module):
        yield from _file_reads(path, importlib.import_module(name))


def _file_reads(path: Path, loaded: Any) -> Iterator[tuple[str, int]]:
    """_literal_reads for one source file, `loaded` the module it is."""
    tree = ast.parse(path.read_text())
    bound = {
        node.targets[0].id: node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
    }
    loops: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)):
            table = node.iter
            if isinstance(table, ast.Call) and isinstance(table.func, ast.Attribute):
                table = table.func.value  # table.items(), table.keys()
            for name in (n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)):
                loops.setdefault(name, []).append(table)

    def names_in(table: ast.AST) -> list[str]:
        found: list[Any] = []
        if isinstance(table, ast.Name):
            found += [k.name for k in getattr(loaded, table.id, ()) if isinstance(k, Knob)]
            table = bound.get(table.id, table)
        found += [c.value for c in ast.walk(table) if isinstance(c, ast.Constant)]
        return [v for v in found if v in REGISTRY]

    def keys(key: ast.AST, line: int) -> list[str]:
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return [key.value]
        if isinstance(key, ast.Attribute) and key.attr == "name":  # knob.name over a table
            key = key.value
        if isinstance(key, ast.Name) and key.id in loops:
            found = [n for table in loops[key.id] for n in names_in(table)]
            if found:
                return found
        raise AssertionError(f"{path.name}:{line} reads a knob no declaration can name")

    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _source(node.value) in SOURCES:
            yield from ((k, node.lineno) for k in keys(node.slice, node.lineno))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and _source(node.func.value) in SOURCES
            and node.args
        ):
            yield from ((k, node.lineno) for k in keys(node.args[0], node.lineno))


@pytest.mark.parametrize("module", _modules())
def test_every_read_in_a_knobs_source_is_declared(module: str) -> None:
    knobs = _knobs_of(module)
    assert knobs, f"{module} defines no registered knob"
    for knob in knobs:
        undeclared = sorted(
            {
                f"{name} (line {line})"
                for name, line in _literal_reads(module)
                if name != knob.name and name not in knob.depends_on
            }
        )
        assert not undeclared, f"knob {knob.name} reads {', '.join(undeclared)} undeclared"


def test_every_declaration_names_another_knob() -> None:
    for knob in REGISTRY.values():
        assert set(knob.depends_on) <= set(REGISTRY) - {knob.name}, knob.name
        assert len(set(knob.depends_on)) == len(knob.depends_on), knob.name


class Recording(dict):
    """A configuration that notes every key read from it."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key: object) -> bool:
        self.read.add(str(key))
        return super().__contains__(key)


def _configurations() -> Iterator[tuple[Any, dict[str, Any]]]:
    """Every sample value of every knob over the others' defaults, on one model of each family."""
    for preset in PRESETS:
        base = {**defaults(), "resolution": preset.resolution or 512}
        for name, knob in REGISTRY.items():
            for value in knob.sample_values():
                if value is not None:
                    yield preset, {**base, name: value}


@pytest.mark.long
def test_every_read_as_rules_and_words_run_is_declared(tmp_path: Path) -> None:
    undeclared: dict[str, set[str]] = {}
    for preset, config in _configurations():
        valid = True
        for knob in REGISTRY.values():
            for backend in ("simulate", "cpu"):
                recording = Recording(config)
                context = ProbeContext(recording, GPU, preset, backend)
                if knob.invalid_reason(config[knob.name], context) and backend == "simulate":
                    valid = False
                recording.read.update(_applies(knob, config, preset))
                extra = recording.read - {knob.name, *knob.depends_on}
                if extra:
                    undeclared.setdefault(knob.name, set()).update(extra)
        if not valid:
            continue  # its words are asked of runnable configurations only
        for knob in REGISTRY.values():
            for target in TARGETS.values():
                recording = Recording(config)
                subject = Subject(recording, preset, 1, tmp_path)
                knob.express(target.vocabulary, config[knob.name], subject, target.own_code)
                extra = recording.read - {knob.name, *knob.depends_on}
                if extra:
                    case = f"{text(config[knob.name])} for {target.vocabulary}"
                    undeclared.setdefault(f"{knob.name} ({case})", set()).update(extra)
    assert not undeclared, "; ".join(f"{k} reads {sorted(v)}" for k, v in undeclared.items())


def _applies(knob: Knob, config: dict[str, Any], preset: Any) -> set[str]:
    recording = Recording(config)
    knob.applies(recording, preset)
    return recording.read
