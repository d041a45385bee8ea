"""Where the shipped configuration lives.

A wheel carries `conf/` and `search_spaces/` inside the package (`autofit/_data/`); an editable
install or a source checkout reads them from the repository root.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from autofit.errors import AutofitError, ConfigError, suggest

_PACKAGE = Path(__file__).resolve().parent
# What the name of a GPU entry or a preset may be: it names studies and result files.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


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
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml"):
        if not candidate.exists():
            raise ConfigError(f"{setting}={name}: no such file")
        return candidate
    path = folder / f"{name}.yaml"
    if not path.exists():
        valid = yaml_names(folder)
        raise ConfigError(
            f"unknown {kind} '{name}'{suggest(name, list(valid))}; valid: {', '.join(valid)} "
            "(or a path to a .yaml file)"
        )
    return path


def ensure_writable(path: Path, what: str = "result") -> None:
    """Fail before the work, not after it: a result that cannot be written would be lost."""

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


# -- writing a set of files --------------------------------------------------------------------
# A file is written under a temporary name in its own folder, flushed to disk, then renamed over
# its final name: rename within one filesystem is atomic (POSIX rename(2); os.replace), so a kill
# at any moment leaves the old file or the new one under the final name, never half of one.


def _temporary(folder: Path, name: str, data: bytes) -> Path:

    handle, temporary = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".partial")
    try:
        os.fchmod(handle, 0o666 & ~_umask())  # mkstemp makes 0600; a plain open() would not
        with os.fdopen(handle, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return Path(temporary)


def _umask() -> int:
    """The process's umask, read without changing it (os.umask can only set it, and setting it
    for a moment would race with the search's threads): Linux reports it in /proc."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def write_together(folder: Path, files: dict[str, str | bytes], marker: str | None = None) -> None:
    """Write `files` (name to contents) into `folder` together or not at all.

    Every file goes to a temporary in `folder` first; only once all are written are they renamed
    into place. `marker` (one of the names) is the folder's commit marker: an older copy of it is
    removed before any file is replaced and the new one is renamed last, so whenever the marker
    exists every file beside it comes from the same write as it (a kill between two renames
    leaves no marker, which readers report as a damaged folder). A failure removes the
    temporaries and leaves the final names as they were (or without the marker)."""

    folder.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    try:
        for name, contents in files.items():
            data = contents.encode() if isinstance(contents, str) else contents
            written[name] = _temporary(folder, name, data)
        with _folder_lock(folder):  # two writers of one folder (workers of one study) take turns
            if marker is not None:
                (folder / marker).unlink(missing_ok=True)
            for name in sorted(written, key=lambda n: n == marker):  # the marker last
                os.replace(written.pop(name), folder / name)
            _sync_folder(folder)
    finally:
        for temporary in written.values():
            temporary.unlink(missing_ok=True)


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive lock on `folder` itself (flock(2) on the folder's descriptor: no lock file is
    left among the outputs) while a set of files is renamed in, so two writers' renames never
    interleave."""

    handle = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # closing releases the lock


def write_atomically(path: Path, contents: str | bytes) -> None:
    """One file, written whole or not at all (see write_together)."""
    write_together(path.parent, {path.name: contents})


def _sync_folder(folder: Path) -> None:
    """Flush the renames themselves (the folder's entries) to disk, where the OS allows it."""

    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass  # some filesystems cannot sync a folder; the renames are still atomic
    finally:
        os.close(handle)
