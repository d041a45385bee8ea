"""Search spaces (`search_spaces/<name>.yaml`): which knob values, resolutions and batches to search.

A space is validated in full before the first probe: an unknown key or knob, a value a knob cannot
take, an empty list or a resolution the model cannot train at is an error naming the file and the
key.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from autofit.errors import ConfigError, shown
from autofit.knobs import Knob, registry
from autofit.knobs.frames import native_frames
from autofit.models import ModelPreset
from autofit.paths import named_yaml, search_spaces_dir
from autofit.search.pareto import BestRule
from autofit.units import resolution_words
from autofit.workloads import FAMILIES
from autofit.yaml_files import read_yaml

TOP_LEVEL = ("batch_size", "resolution", "knobs", "families", "target", "if_nothing_fits")
TARGET = ("resolution", "min_batch", *(f.name for f in fields(BestRule)))
SEARCHED_ELSEWHERE = ("batch_size", "resolution")  # not structural knobs: the planner varies them
# Combinations of knob values and resolutions a space may hold: the largest shipped space holds
# 768 (the default, for Flux.1-dev), each a probe or more. Each is checked and the invalid ones
# recorded before the first probe, about 15 ms apiece (12,288 took 3 minutes on 2 cores).
MAX_COMBINATIONS = 5_000


@dataclass(frozen=True)
class SearchSpace:
    """A validated space, with resolutions resolved for one model."""

    name: str
    min_batch: int
    max_batch: int
    resolutions: tuple[int, ...]
    knobs: dict[str, tuple[Any, ...]]  # knob -> values to try, in the file's order
    target_resolution: int
    target_min_batch: int
    best_rule: BestRule = BestRule()
    # The space searched next where this one fits nothing at its target (a shipped space's name
    # or a YAML file's path): the recipes a smaller card runs, measured rather than suggested.
    if_nothing_fits: str | None = None

    def combinations(self) -> Iterator[dict[str, Any]]:
        """Every structural combination: one value per searched knob."""
        names = list(self.knobs)
        for values in itertools.product(*(self.knobs[n] for n in names)):
            yield dict(zip(names, values, strict=True))


def space_path(name: str) -> Path:
    """`space=default` is search_spaces/default.yaml; a path to a YAML file is taken as is."""
    return named_yaml(name, search_spaces_dir(), "space", "space")


def _display(path: Path) -> str:
    """A shipped space as `search_spaces/<name>.yaml`, any other file as given."""
    try:
        return str(path.resolve().relative_to(search_spaces_dir().parent))
    except ValueError:
        return str(path)


def _resolution(value: Any, preset: ModelPreset, where: str) -> int:
    if isinstance(value, str) and value.startswith("x"):
        try:
            factor = float(value[1:])
        except ValueError:
            raise ConfigError(
                f"{where}: {shown(value)} is not a resolution; write pixels (1024) or xF (x0.5)"
            ) from None
        step = preset.granularity
        return max(step, int(preset.resolution * factor) // step * step)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(
            f"{where}: {shown(value)} is not a resolution; write pixels (1024) or xF (x0.5)"
        )
    try:
        preset.check_resolution(value)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return value


def _int(data: dict[str, Any], key: str, where: str) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}.{key}: {shown(value)} is not valid; expected an integer >= 1")
    return value


def load_space(name: str, preset: ModelPreset) -> SearchSpace:
    file = space_path(name)
    path = _display(file)
    data = read_yaml(file, path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with keys {', '.join(TOP_LEVEL)}")
    for key in data:
        if key not in TOP_LEVEL:
            raise ConfigError(
                f"{path}: unknown key {shown(key)}; valid keys: {', '.join(TOP_LEVEL)}"
            )
    min_batch, max_batch = _batch_range(data, path)
    resolutions = _resolutions(data, preset, path)
    knobs = _family_knobs(data, _knobs(data.get("knobs") or {}, path), preset, path)
    counts = [len(values) for values in knobs.values()] + [len(resolutions)]
    if math.prod(counts) > MAX_COMBINATIONS:
        raise ConfigError(
            f"{path}: {' x '.join(map(str, counts))} = {math.prod(counts)} combinations of knob "
            f"values and resolutions; autofit searches at most {MAX_COMBINATIONS} (a probe or "
            "more each): search fewer values, or split the space"
        )
    target, target_resolution, target_min_batch = _target(
        data, preset, path, resolutions, max_batch
    )
    return SearchSpace(
        name=file.stem,
        min_batch=min_batch,
        max_batch=max_batch,
        resolutions=resolutions,
        knobs=knobs,
        target_resolution=target_resolution,
        target_min_batch=target_min_batch,
        best_rule=BestRule().replaced(target, f"{path}: target."),
        if_nothing_fits=_next_space(data.get("if_nothing_fits"), file, path),
    )


def _next_space(name: Any, file: Path, path: str) -> str | None:
    """The space `if_nothing_fits` names, checked to exist: a shipped space's name, or a YAML
    file's path (relative to the space file that names it)."""
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise ConfigError(
            f"{path}: if_nothing_fits={shown(name)} is not valid; expected the name of a space "
            "(or a path to its file), searched where this one fits nothing"
        )
    if Path(name).suffix in (".yaml", ".yml") and not Path(name).is_absolute():
        name = str(file.parent / name)
    try:
        if space_path(name).resolve() == file.resolve():
            raise ConfigError("it names the space itself")
    except ConfigError as exc:
        raise ConfigError(f"{path}: if_nothing_fits: {exc}") from None
    return name


def _batch_range(data: dict[str, Any], path: str) -> tuple[int, int]:
    """The space's `batch_size`: its min and max."""
    batch = data.get("batch_size") or {}
    if not isinstance(batch, dict):
        raise ConfigError(f"{path}: batch_size: expected min and max")
    min_batch, max_batch = (
        _int(batch, "min", f"{path}: batch_size"),
        _int(batch, "max", f"{path}: batch_size"),
    )
    if min_batch > max_batch:
        raise ConfigError(f"{path}: batch_size: min={min_batch} is above max={max_batch}")
    return min_batch, max_batch


def _resolutions(data: dict[str, Any], preset: ModelPreset, path: str) -> tuple[int, ...]:
    """The space's resolutions in pixels, each once, in the file's order."""
    raw_resolutions = data.get("resolution", ["x1"])
    if not isinstance(raw_resolutions, list) or not raw_resolutions:
        raise ConfigError(f"{path}: resolution: expected a non-empty list")
    return tuple(
        dict.fromkeys(
            _resolution(v, preset, f"{path}: resolution[{i}]")
            for i, v in enumerate(raw_resolutions)
        )
    )


def _family_knobs(
    data: dict[str, Any],
    knobs: dict[str, tuple[Any, ...]],
    preset: ModelPreset,
    path: str,
) -> dict[str, tuple[Any, ...]]:
    """The common `knobs` with the values the space's `families` section gives the preset's
    family in their place; every family's section is checked, whichever the preset's."""
    families = data.get("families") or {}
    if not isinstance(families, dict):
        raise ConfigError(f"{path}: families: expected a mapping of model family -> knobs")
    for family, section in families.items():
        if family not in FAMILIES:
            raise ConfigError(
                f"{path}: families.{family}: unknown model family; valid: {', '.join(FAMILIES)}"
            )
        overrides = _knobs(section or {}, path, prefix=f"families.{family}")
        if family == preset.family:  # a family's values replace the common ones
            knobs = {**knobs, **overrides}
    if FAMILIES[preset.family].video and "frames" not in knobs:
        # A video model's clips are as long as its native ones unless the space says: the answer
        # (best.yaml, its re-measure command) names the length it measured.
        knobs = {**knobs, "frames": (native_frames(preset),)}
    return knobs


def _target(
    data: dict[str, Any],
    preset: ModelPreset,
    path: str,
    resolutions: tuple[int, ...],
    max_batch: int,
) -> tuple[dict[str, Any], int, int]:
    """The space's `target` section, checked: the section itself (for the best rule), its
    resolution (one of those searched) and its least batch (no more than the space's max)."""
    target = data.get("target") or {}
    if not isinstance(target, dict):
        raise ConfigError(f"{path}: target: expected {', '.join(TARGET)}")
    unknown = [key for key in target if key not in TARGET]  # keys of any type: no sorting
    if unknown:
        raise ConfigError(
            f"{path}: target.{unknown[0]}: unknown setting; valid: {', '.join(TARGET)}"
        )
    target_resolution = _resolution(
        target.get("resolution", "x1"), preset, f"{path}: target.resolution"
    )
    if target_resolution not in resolutions:
        raise ConfigError(
            f"{path}: target.resolution: {resolution_words(target_resolution, preset.unit)} is not "
            "among the searched resolutions "
            f"({', '.join(map(str, resolutions))})"
        )
    target_min_batch = _int(
        {"min_batch": target.get("min_batch", 1)}, "min_batch", f"{path}: target"
    )
    if target_min_batch > max_batch:
        raise ConfigError(
            f"{path}: target.min_batch={target_min_batch} is above batch_size.max={max_batch}"
        )
    return target, target_resolution, target_min_batch


def _knobs(section: Any, path: str, prefix: str = "knobs") -> dict[str, tuple[Any, ...]]:
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: {prefix}: expected a mapping of knob -> list of values")
    table: dict[str, Knob] = {
        name: knob for name, knob in registry().items() if name not in SEARCHED_ELSEWHERE
    }
    knobs: dict[str, tuple[Any, ...]] = {}
    for name, values in section.items():
        if name not in table:
            hint = " (set it under batch_size or resolution)" if name in SEARCHED_ELSEWHERE else ""
            raise ConfigError(
                f"{path}: {prefix}.{name}: unknown knob{hint}; valid knobs: {', '.join(table)}"
            )
        if not isinstance(values, list):
            values = [values]
        if not values:
            raise ConfigError(f"{path}: {prefix}.{name}: the list of values is empty")
        try:
            parsed = tuple(table[name].parse(v) for v in values)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {prefix}.{name}: {exc}") from None
        knobs[name] = tuple(dict.fromkeys(parsed))
    return knobs
