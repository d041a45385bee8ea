"""Compose a command's configuration from `conf/` with Hydra, and turn every mistake into one line.

Overrides are checked before composition so the user hears about the bad name or value itself
(`unknown model 'sana_1600'; valid: ...`), not about Hydra's internals.
"""

from __future__ import annotations

import difflib
from typing import Any

from autofit.errors import ConfigError
from autofit.paths import conf_dir, group_options

GROUPS = ("model", "gpu")
_MISSING = object()


def _register_knob_defaults() -> None:
    """Expose every knob's default as the `knobs` config, so YAML files need not repeat them."""
    from hydra.core.config_store import ConfigStore

    from autofit.knobs import registry

    ConfigStore.instance().store(
        name="knobs", node={k.name: k.default for k in registry().values()}
    )


def suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _parse(overrides: list[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    parsed = []
    for text in overrides:
        try:
            parsed.append(parser.parse_override(text))
        except HydraException as exc:
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else "cannot be parsed"
            raise ConfigError(
                f"malformed override '{text}': {detail}; write key=value, e.g. batch_size=4"
            ) from None
    return parsed


def _values(override: Any) -> list[Any]:
    """The value of an override, or each value of a sweep (`model=a,b`)."""
    if override.is_sweep_override():
        return list(override.sweep_iterator())
    return [override.value()]


def _check_groups(parsed: list[Any]) -> None:
    for override in parsed:
        group = override.key_or_group
        if group not in GROUPS:
            continue
        options = group_options(group)
        for value in _values(override):
            if value not in options:
                raise ConfigError(
                    f"unknown {group} '{value}'{suggest(str(value), options)}; valid: {', '.join(options)}"
                )


def _compose(command: str, overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(
            config_dir=str(conf_dir()), version_base="1.3", job_name=command
        ):
            return compose(config_name=command, overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"cannot compose 'autofit {command}' with {' '.join(overrides)}: {first}"
        ) from None


def command_groups(command: str) -> list[str]:
    """The config groups (model, gpu) that conf/<command>.yaml lists in its defaults."""
    import re

    text = (conf_dir() / f"{command}.yaml").read_text()
    return [g for g in GROUPS if re.search(rf"^\s*-\s*{g}:", text, re.MULTILINE)]


def validate_overrides(command: str, overrides: list[str]) -> None:
    """Check every override's key and every group choice (each value of a sweep) before Hydra
    sees them; knob values are checked once composed."""
    from omegaconf import OmegaConf

    _register_knob_defaults()
    parsed = _parse(overrides)
    groups = command_groups(command)
    for override in parsed:
        key = override.key_or_group
        if key in GROUPS and key not in groups:
            settings = [k for k in _compose(command, []) if k not in groups]
            raise ConfigError(
                f"unknown setting '{key}' for 'autofit {command}'; valid settings: {', '.join(settings)}"
            )
    _check_groups(parsed)  # before any composition: a bad model or GPU name costs no Hydra run
    # Keys are checked against the config the group choices give (the first of a sweep's), so
    # nested model keys resolve.
    group_overrides = [
        f"{o.key_or_group}={_values(o)[0]}" for o in parsed if o.key_or_group in groups
    ]
    base = _compose(command, group_overrides)
    settings = [k for k in base if k not in groups]
    for override in parsed:
        key = override.key_or_group
        if key in groups or key.startswith(("hydra.", "hydra/")):
            continue
        if OmegaConf.select(base, key, default=_MISSING) is _MISSING:
            raise ConfigError(
                f"unknown setting '{key}' for 'autofit {command}'{suggest(key, settings)}; "
                f"valid settings: {', '.join(settings)}"
            )


def compose_config(command: str, overrides: list[str]) -> Any:
    """The composed DictConfig for `autofit <command> <overrides>`, or a one-line ConfigError."""
    validate_overrides(command, overrides)
    return _compose(command, overrides)
