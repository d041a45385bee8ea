"""Calibration sets: `conf/calibration/<name>.yaml`, a list of cases, each crossed out into
configurations."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autofit.errors import ConfigError, shown
from autofit.gpus import load_gpu
from autofit.knobs import parse_all
from autofit.models import load_preset
from autofit.paths import conf_dir, named_yaml
from autofit.yaml_files import read_yaml

CASE_KEYS = ("model", "target", "knobs", "vary")


@dataclass(frozen=True)
class CalibrationCase:
    """One configuration to run twice: `model` on `target` (None: the local GPU) with `knobs`."""

    model: str
    target: str | None
    knobs: dict[str, Any]
    name: str = ""  # a published row's id, where the case is one

    def key(self, local_gpu: str) -> str:
        """What identifies the case in a CSV, so a rerun skips the cases already measured."""
        words = " ".join(f"{k}={_word(v)}" for k, v in sorted(self.knobs.items()))
        case = f"{self.model}@{self.target or local_gpu} {words}".strip()
        return f"{self.name}: {case}" if self.name else case


def _word(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def set_path(name: str) -> Path:
    return named_yaml(name, conf_dir() / "calibration", "set", "calibration set")


def load_set(name: str) -> list[CalibrationCase]:
    """Every configuration of the set, in file order, each checked against the catalogs and the
    knobs (so a typo fails before the first probe, naming the case)."""
    path = set_path(name)
    data = read_yaml(path, path)
    raw_cases = data.get("cases") if isinstance(data, dict) else None
    if not isinstance(raw_cases, list) or not raw_cases:
        raise ConfigError(f"{path}: expected a non-empty list under 'cases'")

    cases: list[CalibrationCase] = []
    for number, raw in enumerate(raw_cases, start=1):
        where = f"{path}: case {number}"
        if not isinstance(raw, dict) or "model" not in raw:
            raise ConfigError(f"{where}: expected a mapping with a 'model'")
        unknown = [key for key in raw if key not in CASE_KEYS]  # keys of any type: no sorting
        if unknown:
            raise ConfigError(
                f"{where}: unknown key {shown(unknown[0])}; valid keys: {', '.join(CASE_KEYS)}"
            )
        load_preset(str(raw["model"]))  # a one-line error naming the valid presets
        if raw.get("target") is not None:
            load_gpu(str(raw["target"]))
        fixed, vary = raw.get("knobs") or {}, raw.get("vary") or {}
        if not isinstance(fixed, dict) or not isinstance(vary, dict):
            raise ConfigError(f"{where}: 'knobs' and 'vary' are mappings of knob to value(s)")
        for knob, values in vary.items():
            if not isinstance(values, list) or not values:
                raise ConfigError(f"{where}: vary.{knob}: expected a non-empty list of values")
        names = list(vary)
        for values in itertools.product(*(vary[n] for n in names)):
            knobs = {**fixed, **dict(zip(names, values, strict=True))}
            try:
                parse_all(knobs)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
            cases.append(CalibrationCase(str(raw["model"]), raw.get("target"), knobs))
    return cases
