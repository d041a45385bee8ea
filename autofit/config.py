"""Compose a command's configuration from `conf/` with Hydra, and turn every mistake into one line.

Overrides are checked before composition so the user hears about the bad name or value itself
(`unknown model 'sana_1600'; valid: ...`), not about Hydra's internals.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from autofit import command_line
from autofit.errors import ConfigError, shown, suggest
from autofit.families import check_family
from autofit.fingerprint import fingerprint
from autofit.gpus import FIELD_PATHS, gpu_suggestion, is_gpu_file, load_gpu, load_gpu_file
from autofit.knobs import registry
from autofit.model_files import is_model_file, preset_entry
from autofit.models import ModelPreset, load_preset
from autofit.paths import conf_dir, group_options

GROUPS = ("model", "gpu")
_MISSING = object()
# The name each GPU file's or model config's entry is stored under (_file_choice) -> the file as
# the user gave it: what a command printed for the user to run again must say (as_given).
_GIVEN_FILES: dict[str, str] = {}


@functools.cache  # once a process: the CLI's name check and the composition both ask for it
def _register_knob_defaults() -> None:
    """Expose every knob's default as the `knobs` config, so YAML files need not repeat them."""
    ConfigStore.instance().store(
        name="knobs", node={k.name: k.default for k in registry().values()}
    )


def _parse(overrides: list[str]) -> list[Any]:

    parser = OverridesParser.create()
    parsed = []
    for index, text in enumerate(overrides):
        try:
            parsed.append(parser.parse_override(text))
        except HydraException as exc:
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else "cannot be parsed"
            raise ConfigError(_malformed(text, overrides[index + 1 : index + 2], detail)) from None
    return parsed


def _malformed(text: str, following: list[str], detail: str) -> str:
    """What to write instead of an override Hydra cannot parse: the forms other tools take
    (`--model=x`, `--model x`, `model x`) as autofit's `model=x`."""
    key, has_value, value = text.lstrip("-").partition("=")
    if text in ("-m", "--multirun"):
        return f"{text} comes first, right after the command: autofit <command> -m key=a,b ..."
    if not has_value and following and "=" not in following[0]:
        return f"malformed override '{text} {following[0]}'; write {_written(key, following[0])}"
    if text.startswith("-") and key:
        written = _written(key, value) if value else f"{key}=<value>"
        return f"malformed override '{text}'; write {written} (no dashes)"
    if not has_value:
        return f"malformed override '{text}'; write {text}=<value>"
    return f"malformed override '{text}': {detail}; write key=value, e.g. batch_size=4"


def _written(key: str, value: str) -> str:
    """`key=value` as the user meant it, for the shell and Hydra: as typed where Hydra parses it
    (`batch_size=4` stays a number), else quoted as text (a value with `;` or a quote)."""

    try:
        OverridesParser.create().parse_override(f"{key}={value}")
        written = f"{key}={value}"
    except HydraException:
        written = command_line.override(key, value)
    return command_line.command([written])


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
            if _is_file(group, value):
                continue  # the user's own card or model: read and checked by _file_choices
            if value not in options:
                also = (
                    " (or a path to a GPU file: gpu=path/to/card.yaml)"
                    if group == "gpu"
                    else " (or a model's config: model=path/to/config.json or model=hf:org/name)"
                )
                near = (
                    gpu_suggestion(str(value)) if group == "gpu" else suggest(str(value), options)
                )
                raise ConfigError(
                    f"unknown {group} {shown(value)}{near}; valid: {', '.join(options)}{also}"
                )


def _check_group_files(command: str, parsed: list[Any]) -> None:
    """Read and check every preset and GPU entry Hydra is to compose (the choices given, else
    the command's default, else the example a missing choice is checked with) before Hydra
    does: its own reading expands a YAML bomb in full and answers broken YAML with a
    traceback. A GPU file or model config of the user's is read by _file_choices."""
    defaults = _defaults(command)
    for group in command_groups(command):
        chosen = [v for o in parsed if o.key_or_group == group for v in _values(o)]
        if not chosen:
            chosen = [EXAMPLES[group] if defaults[group] == "???" else defaults[group]]
        for value in chosen:
            if _is_file(group, value):
                continue
            if group == "gpu":
                load_gpu(str(value))
                continue
            # Which families there are is autofit/workloads/' to say: models.py, below it,
            # checks a preset's fields but cannot ask.
            check_family(load_preset(str(value)).family, f"conf/model/{value}.yaml: ")


def _is_file(group: str, value: Any) -> bool:
    return is_gpu_file(value) if group == "gpu" else group == "model" and is_model_file(value)


def _file_choice(group: str, value: str) -> str:
    """`gpu=path/to/card.yaml`, `model=path/to/config.json` or `model=hf:org/name`: the entry
    it makes, checked and completed with its defaults, stored in Hydra's ConfigStore as a choice
    of its group under a name no shipped entry has (the file's stem and a hash of its path and
    contents); that name is what Hydra is given."""

    if group == "gpu":
        path = Path(value).expanduser()
        stem, where = path.stem, str(path.resolve())
        entry = load_gpu_file(path, source=f"gpu={value}").to_dict()
    else:
        entry = preset_entry(value)
        ModelPreset.from_dict(entry, source=f"model={value}")
        stem, where = entry["name"], entry["notes"]
    digest = fingerprint({"path": where, "entry": entry})[:8]
    choice = f"file-{re.sub(r'[^A-Za-z0-9_]', '_', stem)}-{digest}"
    ConfigStore.instance().store(group=group, name=choice, node=entry)
    _GIVEN_FILES[choice] = value
    return choice


def as_given(overrides: list[str]) -> list[str]:
    """A Hydra job's overrides (a sweep's) as the user gave them: a GPU file's or model config's
    stored name back to its path, where this process stored it."""
    given = []
    for text in overrides:
        key, _, value = text.partition("=")
        if key in GROUPS and value in _GIVEN_FILES:
            text = f"{key}={_GIVEN_FILES[value]}"
        given.append(text)
    return given


def _file_choices(overrides: list[str], parsed: list[Any]) -> list[str]:
    """The overrides with every file choice (`gpu=./card.yaml`, `gpu=a40,./card.yaml`,
    `model=./config.json`) replaced by the name its entry is stored under."""
    result = []
    for text, override in zip(overrides, parsed, strict=True):
        group = override.key_or_group
        values = _values(override) if group in GROUPS else []
        if any(_is_file(group, v) for v in values):
            choices = [_file_choice(group, v) if _is_file(group, v) else str(v) for v in values]
            text = f"{override.get_key_element()}={','.join(choices)}"
        result.append(text)
    return result


def _unknown_gpu_field(field: str, base: Any) -> ConfigError:
    if field in FIELD_PATHS:
        return ConfigError(
            f"gpu.{field}: the gpu entry {base.gpu.name} does not set it; add it with "
            f"+gpu.{field}=<value>"
        )
    return ConfigError(
        f"unknown gpu field '{field}'{suggest(field, FIELD_PATHS)}; valid fields: "
        f"{', '.join(FIELD_PATHS)}"
    )


def _compose(command: str, overrides: list[str]) -> Any:

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


def _defaults(command: str) -> dict[str, str]:
    """The group choices (model, gpu) conf/<command>.yaml's defaults list makes: a name, or `???`
    where the user must name one."""
    text = (conf_dir() / f"{command}.yaml").read_text()
    found = dict(re.findall(rf"^\s*-\s*({'|'.join(GROUPS)}):\s*(\S+)", text, re.MULTILINE))
    return {g: found[g] for g in GROUPS if g in found}


def command_groups(command: str) -> list[str]:
    """The config groups (model, gpu) that conf/<command>.yaml lists in its defaults."""
    return list(_defaults(command))


def mandatory_groups(command: str) -> list[str]:
    """The groups conf/<command>.yaml gives no default (`- model: ???`): the user names them."""
    return [g for g, choice in _defaults(command).items() if choice == "???"]


EXAMPLES = {"model": "sana_1600m", "gpu": "a40"}  # what a message offers as an example


# The Hydra settings a command takes: which launcher runs a sweep and that launcher's own settings
# (partition, timeout_min, cpus_per_task, n_jobs, ...), and where runs and sweeps write. Anything
# else under hydra is refused like any unknown setting: hydra.job.env_set / env_copy change the
# environment the run (and its probe server) starts in, hydra.callbacks and any `_target_` name
# a module Hydra imports and calls (hydra.utils.instantiate).
HYDRA_GROUPS = ("hydra/launcher",)
HYDRA_PREFIXES = ("hydra.launcher.",)
HYDRA_KEYS = ("hydra.sweep.dir", "hydra.sweep.subdir", "hydra.run.dir")
HYDRA_ALLOWED = "hydra/launcher=<name>, hydra.launcher.<setting>, " + ", ".join(HYDRA_KEYS)


def _names_code(value: Any) -> bool:
    """Whether a value (a dict or list override, at any depth) holds a `_target_` key."""
    if isinstance(value, dict):
        return any(str(k) == "_target_" or _names_code(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_names_code(v) for v in value)
    return False


def _check_hydra(command: str, override: Any) -> None:
    """Refuse a Hydra setting autofit does not take (HYDRA_ALLOWED), and `_target_` anywhere."""
    key = override.key_or_group
    values = [] if override.is_delete() else _values(override)
    imports = "_target_" in key.split(".") or any(_names_code(v) for v in values)
    if not imports and not key.startswith(("hydra.", "hydra/")) and key != "hydra":
        return
    allowed = not imports and (
        (key in HYDRA_GROUPS and override.package is None)
        or (key.startswith(HYDRA_PREFIXES) and override.package is None)
        or key in HYDRA_KEYS
    )
    if allowed and not override.is_delete():
        return
    why = (
        "a _target_ names code for Hydra to import"
        if imports
        else "it would change the environment or the code a run starts with"
        if key.startswith(("hydra.job", "hydra.callbacks", "hydra/callbacks"))
        else "autofit does not take it"
    )
    raise ConfigError(
        f"unknown setting '{override.get_key_element()}' for 'autofit {command}' ({why}); "
        f"valid hydra settings: {HYDRA_ALLOWED}"
    )


def _setting_names(base: Any, groups: Any) -> list[str]:
    """The settings a command takes, nested ones dotted (`target.min_batch`), groups left out."""
    names = []
    for key in base:
        if key in groups:
            continue
        value = base[key]
        if isinstance(value, DictConfig):
            names += [f"{key}.{inner}" for inner in value]
        else:
            names.append(key)
    return names


def check_names(command: str, overrides: list[str], sweep: bool = False) -> list[Any]:
    """The overrides parsed, each a key=value, no sweep without `sweep`, no Hydra setting that
    is not the user's to give, and every model and GPU name one there is: what needs no file
    read and no composition (the CLI asks it before it loads a command). Several values for one
    key need `sweep` (the command's `-m`)."""
    _register_knob_defaults()
    parsed = _parse(overrides)
    groups = command_groups(command)
    for override in parsed:
        if not sweep and override.is_sweep_override():
            raise ConfigError(
                f"{override.input_line} lists several values; to run each, add -m: "
                f"autofit {command} -m {' '.join(overrides)}"
            )
        _check_hydra(command, override)
        key = override.key_or_group
        if key in GROUPS and key not in groups:
            examples = [f"{g}={EXAMPLES[g]}" for g in mandatory_groups(command)]
            settings = _setting_names(_compose(command, examples), groups)
            raise ConfigError(
                f"unknown setting '{key}' for 'autofit {command}'; valid settings: {', '.join(settings)}"
            )
    _check_groups(parsed)  # before any composition: a bad model or GPU name costs no Hydra run
    return parsed


def validate_overrides(command: str, overrides: list[str], sweep: bool = False) -> list[str]:
    """Check every override's key and every group choice (each value of a sweep) before Hydra
    sees them (`check_names`, then each preset and GPU entry read); knob values are checked once
    composed. Returns the overrides Hydra is to compose: the given ones, with a GPU file read,
    checked and stored under a name of its own."""
    groups = command_groups(command)
    parsed = check_names(command, overrides, sweep)
    _check_group_files(command, parsed)
    overrides = _file_choices(overrides, parsed)
    parsed = _parse(overrides)
    # Keys are checked against the config the group choices give (the first of a sweep's), so
    # nested model keys resolve.
    group_overrides = [
        f"{o.key_or_group}={_values(o)[0]}" for o in parsed if o.key_or_group in groups
    ]
    given = {o.key_or_group: _values(o)[0] for o in parsed if o.key_or_group in groups}
    missing = [group for group in mandatory_groups(command) if group not in given]
    # keys are checked first (a misspelt one is the likelier slip), against an example's groups
    base = _compose(command, group_overrides + [f"{g}={EXAMPLES[g]}" for g in missing])
    settings = _setting_names(base, groups)
    for override in parsed:
        key = override.key_or_group
        if key in groups or key.startswith(("hydra.", "hydra/")):
            continue
        if OmegaConf.select(base, key, default=_MISSING) is _MISSING:
            if key.startswith("gpu.") and "gpu" in groups:
                if override.is_add() and key.removeprefix("gpu.") in FIELD_PATHS:
                    continue  # `+gpu.tflops.bf16=65`: a field the entry leaves out, checked composed
                raise _unknown_gpu_field(key.removeprefix("gpu."), base)
            raise ConfigError(
                f"unknown setting '{key}' for 'autofit {command}'{suggest(key, settings)}; "
                f"valid settings: {', '.join(settings)}"
            )
    if missing:
        example = " ".join(
            f"{group}={given.get(group, EXAMPLES[group])}" for group in mandatory_groups(command)
        )
        raise ConfigError(
            f"autofit {command} needs {' and '.join(f'{group}=' for group in missing)}, e.g. "
            f"autofit {command} {example}; `autofit models` lists the models, `autofit "
            f"{command} --help` the GPUs"
        )
    return overrides


def compose_config(command: str, overrides: list[str]) -> Any:
    """The composed DictConfig for `autofit <command> <overrides>`, or a one-line ConfigError."""
    return _compose(command, validate_overrides(command, overrides))
