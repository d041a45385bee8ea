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


def calibration_dir() -> Path:
    """Calibration data shipped with autofit: the published measurements (published.csv), and the
    GPU calibrations committed as they are measured."""
    return _shipped("calibration")


def group_options(group: str) -> list[str]:
    """The names a config group offers (`model`, `gpu`): its YAML files, sorted."""
    return yaml_names(conf_dir() / group)


def yaml_names(folder: Path) -> list[str]:
    """The names of the YAML files in `folder`, sorted: what a setting naming one may be."""
    return sorted(p.stem for p in folder.glob("*.yaml"))


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
        valid = yaml_names(folder)
        raise ConfigError(
            f"unknown {kind} '{name}'; valid: {', '.join(valid)} (or a path to a .yaml file)"
        )
    return path


def ensure_writable(path: Path, what: str = "result") -> None:
    """Fail before the work, not after it: a result that cannot be written would be lost."""
    import os

    from autofit.errors import AutofitError

    where = f"cannot write the {what} to {path}"
    blocker = next((p for p in [*reversed(path.parents)] if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        raise AutofitError(f"{where}: {blocker} is a file, not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AutofitError(f"{where}: {exc.strerror}") from None
    if path.is_dir() or not os.access(path.parent, os.W_OK):
        raise AutofitError(f"{where}: not a writable file path")
