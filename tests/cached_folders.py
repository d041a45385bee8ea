"""Folders the tests build once and keep under the git-ignored .cache/: a trainer's pinned
packages installed beside autofit's environment, a trainer's sources at a commit.

Each is built in a temporary folder beside it and renamed into place when whole, so a half-built
folder from an interrupted run is never taken for a built one; where another process renamed its
own first, that one is kept.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path


def built_once(folder: Path, build: Callable[[Path], None]) -> Path:
    """`folder`, made by `build` (given the empty folder to fill) the first time it is asked for."""
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(dir=folder.parent, prefix="building-"))
    try:
        build(building)
        try:
            building.rename(folder)
        except OSError:
            if not folder.is_dir():  # not another process's whole folder: a real failure
                raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return folder


def pip_install(into: Path, pins: Iterable[str]) -> None:
    """`pins` installed into `into` with pip --target and no dependencies: exactly these, with
    nothing of autofit's environment touched."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(into),
         *pins],
        check=True,
    )  # fmt: skip


def pip_site(folder: Path, pins: Iterable[str]) -> Path:
    """The folder holding `pins`, installed the first time it is asked for."""
    return built_once(folder, lambda into: pip_install(into, pins))


def git_sources(
    repo: Path, commit: str, paths: Iterable[str], into: Path, keep: Callable[[str], bool]
) -> None:
    """The files under `paths` at `commit` of the clone `repo` that `keep` keeps, written into
    `into` (git archive: the clone's work tree is never read)."""
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "-r", "--name-only", commit, *paths],
        check=True, capture_output=True, text=True,
    ).stdout.splitlines()  # fmt: skip
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", commit, *[name for name in listed if keep(name)]],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)


def clone_with(commit: str, candidates: Iterable[Path]) -> Path | None:
    """The first of `candidates` that is a git clone holding `commit`, if any."""
    for path in candidates:
        found = subprocess.run(
            ["git", "-C", str(path), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
        )
        if found.returncode == 0:
            return path
    return None
