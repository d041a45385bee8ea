"""Where the shipped configuration lives.

A wheel carries `conf/` and `search_spaces/` inside the package (`autofit/_data/`); an editable
install or a source checkout reads them from the repository root.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _shipped(name: str) -> Path:
    for candidate in (_PACKAGE / "_data" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(
        f"autofit's {name}/ folder is missing from {_PACKAGE}: reinstall autofit"
    )


def conf_dir() -> Path:
    return _shipped("conf")


def search_spaces_dir() -> Path:
    return _shipped("search_spaces")


def group_options(group: str) -> list[str]:
    """The names a config group offers (`model`, `gpu`): its YAML files, sorted."""
    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


def named_yaml(name: str, folder: Path, setting: str, kind: str) -> Path:
    """`<setting>=<name>` is `<folder>/<name>.yaml`; a path to a YAML file is taken as is."""
    from autofit.errors import ConfigError

    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml"):
        if not candidate.exists():
            raise ConfigError(f"{setting}={name}: no such file")
        return candidate
    path = folder / f"{name}.yaml"
    if not path.exists():
        valid = sorted(p.stem for p in folder.glob("*.yaml"))
        raise ConfigError(
            f"unknown {kind} '{name}'; valid: {', '.join(valid)} (or a path to a .yaml file)"
        )
    return path
