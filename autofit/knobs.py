"""Knobs: the settings a probe varies, with the values each can take.

A knob is declared once, next to the code that applies it (a `Technique` in `autofit/techniques/`,
or a workload knob below). This module only describes and validates values; it imports no torch, so
the CLI can reject a bad value in a fraction of a second.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autofit.errors import ConfigError


@dataclass(frozen=True)
class Knob:
    """One setting: its name, default, and the values it accepts.

    `choices` closes the set of values for a string or bool knob; `minimum` bounds an int knob.
    A default of None means "decided by the model" (the native resolution, for example).
    """

    name: str
    default: Any
    help: str
    kind: type = str
    choices: tuple[Any, ...] | None = None
    minimum: int | None = None

    def parse(self, value: Any) -> Any:
        """The value as this knob holds it, or a ConfigError naming the value and the valid ones."""
        if value is None and self.default is None:
            return None
        if self.kind is bool:
            if isinstance(value, bool):
                return value
            raise ConfigError(f"{self.name}={value!r} is not valid; valid values: true, false")
        if self.kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{self.name}={value!r} is not valid; expected {self.describe()}")
            if self.minimum is not None and value < self.minimum:
                raise ConfigError(f"{self.name}={value} is not valid; expected {self.describe()}")
            if self.choices is not None and value not in self.choices:
                raise ConfigError(
                    f"{self.name}={value} is not valid; valid values: {self.describe()}"
                )
            return value
        if self.choices is not None and value not in self.choices:
            raise ConfigError(
                f"{self.name}={value!r} is not valid; valid values: {', '.join(map(str, self.choices))}"
            )
        return value

    def describe(self) -> str:
        if self.choices is not None:
            return " | ".join(
                str(c).lower() if isinstance(c, bool) else str(c) for c in self.choices
            )
        if self.kind is int:
            return f"an integer >= {self.minimum}" if self.minimum is not None else "an integer"
        if self.kind is bool:
            return "true | false"
        return self.kind.__name__


# What a workload is trained on; every other knob belongs to a technique.
WORKLOAD_KNOBS: tuple[Knob, ...] = (
    Knob("batch_size", 1, "samples per optimizer step on one GPU", kind=int, minimum=1),
    Knob(
        "resolution",
        None,
        "square image side in pixels, or sequence length in tokens for language models "
        "(null: the model's native size)",
        kind=int,
        minimum=1,
    ),
)


def registry() -> dict[str, Knob]:
    """Every knob by name, workload knobs first, then techniques in the order they are applied."""
    from autofit.techniques import TECHNIQUES

    knobs = list(WORKLOAD_KNOBS) + [t.knob for t in TECHNIQUES]
    return {k.name: k for k in knobs}


def parse_all(values: dict[str, Any], knobs: Sequence[Knob] | None = None) -> dict[str, Any]:
    """Validate every knob's value, filling defaults; the first bad value raises ConfigError."""
    table = {k.name: k for k in knobs} if knobs is not None else registry()
    unknown = sorted(set(values) - set(table))
    if unknown:
        raise ConfigError(f"unknown knob '{unknown[0]}'; valid knobs: {', '.join(table)}")
    return {name: knob.parse(values.get(name, knob.default)) for name, knob in table.items()}
