"""What the reference pages say, found by running the declarations themselves.

- A knob's *rules* are the reasons its `invalid_reason` gives for each of its values, with every
  other knob at its default or one of them changed, on an A40 and a T4, for the simulate and cpu
  backends, on one preset of each model family. A reason that names the preset says `<model>`;
  the figure of an open integer knob the run set, `N`.
- A knob's *trainer words* for a value come from exporting a run autofit can measure: the other
  knobs at their defaults, else the first single change (in the registry's order) that makes the
  run valid, those in which the knob matters first. Where the export refuses another knob, that
  knob takes each of its other values in turn (two knobs deep). A value refused in one run and
  exported in a later one keeps both.

Everything is tried in a fixed order, so the same autofit finds the same facts on every machine.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from autofit.export.base import ExportPlan, Refused, Target
from autofit.export.point import StudyPoint
from autofit.gpus import GpuSpec, load_gpu
from autofit.knobs import REGISTRY, WORKLOAD_KNOBS, Knob, defaults, invalid_reason
from autofit.knobs.base import ProbeContext
from autofit.models import ModelPreset, load_preset
from autofit.paths import group_options
from autofit.units import value as text

GPU = "a40"  # what a run is checked against and exported from
RULE_GPUS = ("a40", "t4")  # a card with bf16 and one without: the rules that depend on it
RULE_BACKENDS = ("simulate", "cpu")
STUDY = "STUDY"  # the study an export's paths name
KNOB_WORD = re.compile(r"\b([a-z][a-z0-9_]*)=([A-Za-z0-9_.|]+)")  # knob=value in a reason


def family_presets() -> dict[str, ModelPreset]:
    """One preset per model family, the first of its family by name; families by name."""
    found: dict[str, ModelPreset] = {}
    for name in group_options("model"):
        if name != "custom":
            preset = load_preset(name)
            found.setdefault(preset.family, preset)
    return dict(sorted(found.items()))


def shown_values(knob: Knob) -> list[Any]:
    """The values the pages show: every value of a closed knob; one past the default of an open
    one (None, the model's native size, for the resolution)."""
    if knob.choices is not None:
        return list(knob.choices)
    return [None] if knob.default is None else [knob.default + 1]


def changed_from_defaults(config: Mapping[str, Any], *besides: str) -> str:
    """The knobs of a run that differ from their defaults, besides `besides` and the resolution,
    as overrides."""
    return " ".join(
        f"{name}={text(value)}"
        for name, value in config.items()
        if name not in (*besides, "resolution") and value != REGISTRY[name].default
    )


def _base(preset: ModelPreset, knob: str, value: Any) -> dict[str, Any]:
    config = {**defaults(), knob: value}
    if config["resolution"] is None:
        config["resolution"] = preset.resolution
    return config


def _point(preset: ModelPreset, config: dict[str, Any]) -> StudyPoint:
    return StudyPoint(
        study=STUDY, summary_path=Path("results", STUDY, "summary.json"), preset=preset,
        gpu=GPU, backend="simulate", label="best", config=config, peak_bytes=1, budget_bytes=2,
        samples_per_s=1.0,
    )  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    """What a target did with a run: its plan, or its refusal; `before`, a refusal of the same
    knob's value in a run tried earlier."""

    config: dict[str, Any]
    plan: ExportPlan | None
    refused: Refused | None
    before: Verdict | None = None


class Facts:
    """The runs and reasons the pages are written from, each found once."""

    def __init__(self) -> None:
        self.presets = family_presets()
        self.gpu = load_gpu(GPU)
        self.changes = [
            {name: value}
            for name, knob in REGISTRY.items()
            if name not in WORKLOAD_KNOBS
            for value in knob.sample_values()
            if value is not None and value != knob.default
        ]
        self._verdicts: dict[tuple[str, str, Any, str], Verdict | None] = {}
        self._rules: dict[str, dict[str, list[str]]] | None = None

    def _valid(self, config: dict[str, Any], preset: ModelPreset) -> bool:
        return invalid_reason(config, self.gpu, preset, "simulate") is None

    def runs(self, preset: ModelPreset, knob: str, value: Any) -> Iterator[dict[str, Any]]:
        """Valid runs with `knob=value` on `preset`: the defaults, then single changes; those in
        which the knob matters first."""
        base = _base(preset, knob, value)
        configs = [{**base, **change} for change in [{}, *self.changes] if knob not in change]
        valid = [config for config in configs if self._valid(config, preset)]
        declared = REGISTRY[knob]
        yield from (c for c in valid if declared.applies(c, preset))
        yield from (c for c in valid if not declared.applies(c, preset))

    def verdict(self, target: Target, knob: str, value: Any, family: str) -> Verdict | None:
        """An export of a run with `knob=value` (with a refusal of it in a run tried before, if
        any), else a refusal of it, else a refusal of another knob; None where no valid run of
        the family has the value."""
        key = (target.name, knob, value, family)
        if key not in self._verdicts:
            self._verdicts[key] = self._find(target, knob, value, self.presets[family])
        return self._verdicts[key]

    def _find(self, target: Target, knob: str, value: Any, preset: ModelPreset) -> Verdict | None:
        refusal: Verdict | None = None
        other: Verdict | None = None
        for config in self.runs(preset, knob, value):
            # After a refusal of the knob, runs are tried as they are: the knob is what counts.
            verdict = self._export(target, knob, preset, config, 2 if refusal is None else 0)
            if verdict.refused is None:
                return replace(verdict, before=refusal)
            if verdict.refused.knob == knob:
                refusal = refusal or verdict
            else:
                other = other or verdict
        return refusal or other

    def _export(
        self, target: Target, knob: str, preset: ModelPreset, config: dict[str, Any], depth: int
    ) -> Verdict:
        """The export of `config`; where it refuses another knob, of the same run with that knob
        at each of its other values in turn (up to `depth` knobs), the first that says more."""
        out = Path("results", STUDY, "export", target.name)
        try:
            verdict = Verdict(config, target.run(_point(preset, config), out), None)
        except Refused as refusal:
            verdict = Verdict(config, None, refusal)
        if verdict.refused is None or verdict.refused.knob == knob or depth == 0:
            return verdict
        other = verdict.refused.knob
        for value in REGISTRY[other].sample_values():
            changed = {**config, other: value}
            if value != config[other] and self._valid(changed, preset):
                again = self._export(target, knob, preset, changed, depth - 1)
                if again.refused is None or again.refused.knob == knob:
                    return again
        return verdict

    def rules(self) -> dict[str, dict[str, list[str]]]:
        """Per knob, each reason the rules give and the families it was given for. A reason goes
        under the knob it names first (the one whose value it is about), else under the knob
        whose rule it is."""
        if self._rules is None:
            gpus = [load_gpu(name) for name in RULE_GPUS]
            self._rules = {name: {} for name in REGISTRY}
            for name, knob in REGISTRY.items():
                for value in knob.sample_values():
                    for family, preset in self.presets.items():
                        for change in [{}, *self.changes]:
                            if name not in change:
                                self._record(knob, {name: value, **change}, gpus, family, preset)
        return self._rules

    def _record(
        self, knob: Knob, set_: dict[str, Any], gpus: list[GpuSpec], family: str,
        preset: ModelPreset,
    ) -> None:  # fmt: skip
        assert self._rules is not None
        config = {**_base(preset, knob.name, set_[knob.name]), **set_}
        for gpu in gpus:
            for backend in RULE_BACKENDS:
                reason = knob.invalid_reason(
                    config[knob.name], ProbeContext(config, gpu, preset, backend)
                )
                if not reason:
                    continue
                named = KNOB_WORD.match(reason)
                owner = named.group(1) if named and named.group(1) in REGISTRY else knob.name
                families = self._rules[owner].setdefault(_general(reason, preset, set_), [])
                if family not in families:
                    families.append(family)


def _general(reason: str, preset: ModelPreset, set_: Mapping[str, Any]) -> str:
    """The reason with the preset's name as `<model>`, and the figure of an open knob the run
    set as `N`."""
    if preset.name in reason:
        reason = reason.replace(f"is a {preset.family} model", "is a <family> model")
        reason = reason.replace(preset.name, "<model>")
    for name, value in set_.items():
        if REGISTRY[name].choices is None and value is not None:
            reason = re.sub(rf"\b{name}={text(value)}\b", f"{name}=N", reason)
    return reason


def merged(reasons: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """Reasons that differ in the value of one `knob=value` only, as one with the values joined
    by `|` (in the knob's order), until no two differ so; each keeps the families of all."""
    found = {reason: list(families) for reason, families in reasons.items()}
    while True:
        groups: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
        for reason in sorted(found):
            for match in KNOB_WORD.finditer(reason):
                key = (match.group(1), reason[: match.start(2)], reason[match.end(2) :])
                groups.setdefault(key, []).append((match.group(2), reason))
        largest = max(
            (group for group in groups.items() if len({v for v, _ in group[1]}) > 1),
            key=lambda group: (len(group[1]), group[0]),
            default=None,
        )
        if largest is None:
            return found
        (knob, head, tail), members = largest
        values = sorted({v for v, _ in members}, key=lambda v: _order(knob, v))
        families: list[str] = []
        for _, reason in members:
            families += [f for f in found.pop(reason) if f not in families]
        found[head + "|".join(values) + tail] = families


def _order(knob: str, value: str) -> tuple[int, str]:
    """Where a value (or the first of values joined by `|`) comes in its knob's values."""
    words = [text(c) for c in (REGISTRY[knob].choices if knob in REGISTRY else None) or ()]
    first = value.split("|")[0]
    return (words.index(first), value) if first in words else (len(words), value)
