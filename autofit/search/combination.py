"""A structural combination of knobs at one resolution, what its search found, and its lineage:
the memory-saving settings it holds and its parents, the faster combinations they save over.

The search (autofit/search/engine.py) runs combinations in waves by how many memory-saving
settings they hold, and starts a combination's search just above the largest batch its parents
fit; the scheduler (autofit/fastpath/scheduler.py) orders them by the same lineage.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from autofit.knobs import REGISTRY
from autofit.records.status import Status
from autofit.search.space import SearchSpace
from autofit.units import resolution_words
from autofit.units import value as show


@dataclass
class Combination:
    """One structural combination at one resolution, and what its search found."""

    knobs: dict[str, Any]  # the searched knobs' values
    resolution: int
    status: Status = Status.PENDING
    best_batch: int | None = None
    probes: int = 0
    reason: str = ""
    unit: str = "pixels"  # the preset's: a language model's resolution is tokens

    def label(self) -> str:
        at = resolution_words(self.resolution, self.unit)
        return " ".join(f"{k}={show(v)}" for k, v in self.knobs.items()) + f" @{at}"

    def to_dict(self) -> dict[str, Any]:
        """What summary.json keeps of it (the unit is the study's model's)."""
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k != "unit"}
        return {**fields, "status": self.status.value}


def memory_savings(knobs: dict[str, Any], space: SearchSpace) -> dict[str, Any]:
    """The knobs set to a memory-saving value, each with the faster value it saves over."""
    found = {}
    for name, knob in REGISTRY.items():
        if name in knobs:
            baseline = knob.saves_memory_over(knobs[name], space.knobs.get(name, ()))
            if baseline is not None:
                found[name] = baseline
    return found


def parents(knobs: dict[str, Any], space: SearchSpace) -> list[dict[str, Any]]:
    """The knobs with one memory-saving setting back at the faster value it saves over."""
    return [{**knobs, name: baseline} for name, baseline in memory_savings(knobs, space).items()]


def hint_key(knobs: dict[str, Any], resolution: int) -> tuple[Any, ...]:
    """What combinations whose per-sample memory is the same share: the resolution and the
    knobs that change what a sample adds."""
    per_sample = {name for name, knob in REGISTRY.items() if knob.per_sample_memory}
    return (resolution, tuple(sorted((k, v) for k, v in knobs.items() if k in per_sample)))


def setting_words(knobs: dict[str, Any], names: dict[str, Any]) -> str:
    """The knobs named in `names` with their values, for a reason: `a=x and b=y`."""
    return " and ".join(f"{name}={show(knobs[name])}" for name in names)


def frozen(knobs: dict[str, Any]) -> tuple[Any, ...]:
    """The knobs as a hashable key."""
    return tuple(sorted(knobs.items()))
