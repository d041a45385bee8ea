"""Typed settings: a command's settings declared once, as a frozen dataclass whose fields carry
their rules, and built from the composed configuration in one pass that refuses the first bad
value with a one-line `ConfigError` naming the setting, the value and what is valid.

    @dataclasses.dataclass(frozen=True)
    class ReportSettings:
        threshold: float = setting(0.10, SHARE_BELOW_1)
        strict: bool = setting(False, FLAG)

    settings = built(ReportSettings, composed)   # every field checked, or one line

Each command's class sits in its module (autofit/commands/) beside conf/<command>.yaml, which
gives the defaults the user sees and overrides. Hydra's structured configs (a dataclass in its
ConfigStore) would refuse a wrong type too, but in words of its own and several lines, and not a
wrong value; so the composed config is checked here, once, before anything is probed, made or
written. This module imports nothing of autofit but its errors: rules that need more (a backend's
names, a knob's values) are declared where that lives and passed in.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from autofit.errors import ConfigError, shown

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Rule:
    """What a setting may be: `valid(value)` says whether it is, `expected` says what is (the
    words after `<name>=<value> is not valid; `), `convert` what a valid value becomes. With
    `optional`, null is valid too and stays None. `then` is a further rule checked after this
    one, with words of its own (a positive number, then a finite one)."""

    valid: Callable[[Any], bool]
    expected: str
    convert: Callable[[Any], Any] = lambda value: value
    optional: bool = False
    then: Rule | None = None

    def __call__(self, name: str, value: Any) -> Any:
        """`value`, converted, or a ConfigError naming `name`."""
        if value is None and self.optional:
            return None
        if not self.valid(value):
            raise ConfigError(f"{name}={shown(value)} is not valid; {self.expected}")
        if self.then is not None:
            self.then(name, value)
        return self.convert(value)

    def or_null(self) -> Rule:
        """This rule, with null (None) valid too."""
        return dataclasses.replace(self, optional=True)


def is_number(value: Any) -> bool:
    """An int or a float; not a bool, which Python counts as an int."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def choice(*values: str) -> Rule:
    return Rule(lambda v: v in values, f"valid values: {', '.join(values)}")


def integer(least: int) -> Rule:
    return Rule(lambda v: is_integer(v) and v >= least, f"expected an integer >= {least}")


def number(valid: Callable[[float], bool], expected: str) -> Rule:
    """A number (int or float, not a bool) for which `valid` holds; a float once read."""
    return Rule(lambda v: is_number(v) and valid(v), expected, convert=float)


FLAG = Rule(lambda v: isinstance(v, bool), "expected true or false")
SHARE = number(lambda v: 0 <= v <= 1, "expected a share from 0 to 1")
FINITE = number(math.isfinite, "expected a finite number")
# A name or a path. Hydra reads `study=2024` as a number: every name is taken as text.
TEXT = Rule(lambda v: not isinstance(v, Mapping | list), "expected a name or a path", convert=str)
ENTRY = Rule(lambda v: isinstance(v, Mapping), "expected a mapping", convert=dict)


def setting(default: Any, rule: Rule, key: str | None = None) -> Any:
    """A settings dataclass's field: its default (the same as conf/<command>.yaml's, for code
    that builds settings itself), its rule, and the config's key where the field's name cannot
    be it (`from`, a Python keyword)."""
    return dataclasses.field(default=default, metadata={"rule": rule, "key": key})


def entry() -> Any:
    """A config group's composed entry (`model`, `gpu`): a mapping, its fields checked where it
    is read (a preset by ModelPreset, a card by GpuSpec)."""
    return dataclasses.field(metadata={"rule": ENTRY})


def group(settings: type[T]) -> Any:
    """A field holding settings of their own, named `<field>.<name>` (`target.min_batch`)."""
    return dataclasses.field(default_factory=settings, metadata={"group": settings})


def built(settings: type[T], composed: Mapping[str, Any] | DictConfig, prefix: str = "") -> T:
    """`settings` from a composed configuration (Hydra's, or a plain mapping), each field checked
    by its rule in the order the class declares them; a key it leaves out takes the default."""
    composed = plain(composed)
    values = {}
    for field in dataclasses.fields(settings):  # type: ignore[arg-type]
        key = field.metadata.get("key") or field.name
        name = prefix + key
        value = composed.get(key, _default(field))
        if "group" in field.metadata:
            values[field.name] = built(field.metadata["group"], ENTRY(name, value), f"{name}.")
        else:
            values[field.name] = field.metadata["rule"](name, value)
    return settings(**values)


def plain(composed: Mapping[str, Any] | DictConfig) -> dict[str, Any]:
    """A composed configuration as plain Python values, interpolations resolved."""
    if isinstance(composed, DictConfig):
        return OmegaConf.to_container(composed, resolve=True)  # type: ignore[return-value]
    return dict(composed)


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return {}
    return field.default
