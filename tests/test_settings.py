"""Typed settings (autofit/settings.py): each command's settings are a frozen dataclass whose
fields carry their rules, built from the composed config before anything runs. A wrong type or
value is one line naming the setting, exit 2, nothing written; the declaration matches
conf/<command>.yaml key for key and default for default."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from helpers import in_process

from autofit.commands.calibrate import CalibrateSettings
from autofit.commands.export import ExportSettings
from autofit.commands.models import ModelsSettings
from autofit.commands.probe import ProbeSettings, probe_settings
from autofit.commands.report import ReportSettings
from autofit.commands.search import SearchSettings, search_settings
from autofit.config import EXAMPLES, compose_config, mandatory_groups
from autofit.errors import ConfigError
from autofit.knobs import registry
from autofit.settings import FLAG, SHARE, TEXT, built, group, integer, plain, setting

SETTINGS = {
    "search": SearchSettings,
    "probe": ProbeSettings,
    "report": ReportSettings,
    "export": ExportSettings,
    "models": ModelsSettings,
    "calibrate": CalibrateSettings,
}


def _composed(command: str) -> dict[str, Any]:
    examples = [f"{g}={EXAMPLES[g]}" for g in mandatory_groups(command)]
    return plain(compose_config(command, examples))


def _keys(settings: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.metadata.get("key") or f.name: f for f in dataclasses.fields(settings)}


@pytest.mark.parametrize("command", SETTINGS)
def test_each_command_declares_every_setting_of_its_yaml_with_its_default(command: str) -> None:
    composed = _composed(command)
    if command == "probe":  # the knobs sit at the config's top level: ProbeSettings.knobs
        composed = {k: v for k, v in composed.items() if k not in registry()}
        composed["knobs"] = None
    fields = _keys(SETTINGS[command])
    assert set(fields) == set(composed), command
    for key, field in fields.items():
        if "group" in field.metadata:
            inner = _keys(field.metadata["group"])
            assert set(inner) == set(composed[key]), key
            assert {k: f.default for k, f in inner.items()} == composed[key], key
        elif field.default is not dataclasses.MISSING and key != "knobs":
            assert field.default == composed[key], key


def test_settings_are_typed_and_frozen() -> None:
    settings = search_settings(
        compose_config("search", ["model=tiny_mlp", "gpu=a40", "study=2024"])
    )
    assert settings.study == "2024"  # Hydra reads a number; a study's name is text
    assert (settings.timeout_s, settings.jobs, settings.target.min_batch) == (900.0, None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.jobs = 2  # type: ignore[misc]
    probe = probe_settings(compose_config("probe", ["model=tiny_mlp", "precision=bf16"]))
    assert probe.knobs["precision"] == "bf16" and set(probe.knobs) == set(registry())


# A wrong type and a wrong value for a setting of each command, and what each says.
REFUSED = [
    (["search", "model=tiny_mlp", "gpu=a40", "jobs=two"], "jobs='two' is not valid; expected an integer >= 1"),
    (["search", "model=tiny_mlp", "gpu=a40", "jobs=0"], "jobs=0 is not valid; expected an integer >= 1"),
    (["search", "model=tiny_mlp", "gpu=a40", "target.min_batch=[1]"], "target.min_batch=[1] is not valid; expected an integer >= 1"),
    (["search", "model=tiny_mlp", "gpu=a40", "target.speed_tolerance=2"], "target.speed_tolerance=2 is not valid; expected a share from 0 to 1"),
    (["search", "model=tiny_mlp", "gpu=a40", "retry_failed=sometimes"], "retry_failed='sometimes' is not valid; expected true or false"),
    (["search", "model=tiny_mlp", "gpu=a40", "storage_patience_s=-1"], "storage_patience_s=-1 is not valid; expected seconds >= 0"),
    (["search", "model=tiny_mlp", "gpu=a40", "study=[a]"], "study=['a'] is not valid; expected a name or a path"),
    (["probe", "model=tiny_mlp", "timeout_s=soon"], "timeout_s='soon' is not valid; expected a number of seconds > 0"),
    (["probe", "model=tiny_mlp", "margin=1"], "margin=1 is not valid; expected auto or a fraction in [0, 1), e.g. 0.05"),
    (["probe", "model=tiny_mlp", "host_memory_gib=inf"], "host_memory_gib=inf is not valid; expected a finite number"),
    (["probe", "model=tiny_mlp", "backend=tpu"], "backend='tpu' is not valid; valid values: auto, simulate, cpu, cuda"),
    (["report", "strict=maybe"], "strict='maybe' is not valid; expected true or false"),
    (["report", "threshold=10"], "threshold=10 is not valid; expected a share between 0 and 1, e.g. 0.10 for 10%"),
    (["export", "point=first"], "point='first' is not valid; expected an integer >= 1"),
    (["export", "target=hydra", "target.global_batch=0"], "target.global_batch=0 is not valid; expected an integer >= 1"),
    (["models", "out=[1]"], "out=[1] is not valid; expected a name or a path"),
    (["calibrate", "set=tiny", "dry_run=yes"], "dry_run='yes' is not valid; expected true or false"),
    (["calibrate", "set=tiny", "measure=tpu"], "measure='tpu' is not valid; valid values: cuda, cpu"),
]  # fmt: skip


@pytest.mark.parametrize("args,says", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_a_wrong_type_or_value_is_refused_at_composition_in_one_line(
    tmp_path: Path, args: list[str], says: str
) -> None:
    done = in_process(*args, cwd=tmp_path)
    assert done.returncode == 2, done
    assert done.stderr == f"autofit: error: {says}\n", done.stderr
    assert done.stdout == ""
    assert not any(tmp_path.iterdir())  # nothing made, nothing written


@dataclasses.dataclass(frozen=True)
class _Inner:
    share: float | None = setting(None, SHARE.or_null())


@dataclasses.dataclass(frozen=True)
class _Example:
    count: int = setting(1, integer(1))
    flag: bool = setting(False, FLAG)
    source: str | None = setting(None, TEXT.or_null(), key="from")
    inner: _Inner = group(_Inner)


def test_the_mechanism_checks_in_declared_order_names_nested_keys_and_fills_defaults() -> None:
    assert built(_Example, {}) == _Example()
    made = built(_Example, {"count": 3, "from": 2024, "inner": {"share": 1}})
    assert made == _Example(count=3, source="2024", inner=_Inner(share=1.0))
    with pytest.raises(ConfigError, match=r"^count=0 is not valid; expected an integer >= 1$"):
        built(_Example, {"count": 0, "flag": "no"})  # the first field declared is told first
    with pytest.raises(ConfigError, match=r"^from=\{'a': 1\} is not valid; expected a name"):
        built(_Example, {"from": {"a": 1}})
    with pytest.raises(ConfigError, match=r"^inner.share=True is not valid; expected a share"):
        built(_Example, {"inner": {"share": True}})
