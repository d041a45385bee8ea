"""The source OneTrainer's own config loader runs from in the tests (issue 39 item 2).

OneTrainer is not on PyPI: its loader is read from its repository at the commit the export is
pinned to, the Python files `scripts/train.py` loads a config with (TrainConfig and its
sub-configs, ConceptConfig, the enums they name) and what those import, taken out of a local
clone (`git archive`; the clone is ONETRAINER_REPO, else the mirror this workplace keeps) into the
git-ignored .cache/. They import torch, accelerate, packaging and tqdm only, which autofit's
environment has: nothing is installed and nothing stands in for a module. Built atomically: a
half-built folder from an interrupted run is never taken for a built one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cached_folders import built_once, clone_with, git_sources

COMMIT = "23df3832e8f213d64c337e39f9365ba46e99fed0"
# What modules/util/config/TrainConfig.py and ConceptConfig.py import, at COMMIT.
SOURCES = (
    "modules/util/config",
    "modules/util/enum",
    "modules/util/commands/TrainCommands.py",
    "modules/util/ModelNames.py",
    "modules/util/ModuleFilter.py",  # what its LoRA wrapper filters module names with
    "modules/util/ModelWeightDtypes.py",
    "modules/util/bf16_stochastic_rounding.py",
    "modules/util/multi_gpu_util.py",
    "modules/util/torch_util.py",
    "modules/util/type_util.py",
)
MIRROR = Path("/work/.mirror/Nerogar+OneTrainer/repo")
ROOT = Path(__file__).resolve().parent.parent
LAYOUT = 1  # raised whenever what the folder holds changes, so an older one is not taken for it
HOME = ROOT / ".cache" / f"onetrainer-{COMMIT[:8]}.{LAYOUT}"
CHECK = Path(__file__).with_name("onetrainer_check.py")
FACTS = Path(__file__).with_name("onetrainer_facts.py")


def repository() -> Path | None:
    """The local clone of OneTrainer holding the pinned commit, if there is one."""
    given = os.environ.get("ONETRAINER_REPO")
    return clone_with(COMMIT, ([Path(given)] if given else []) + [MIRROR])


def home() -> Path:
    """The folder holding OneTrainer's config sources at COMMIT, built once
    (tests/cached_folders.py)."""

    def build(into: Path) -> None:
        repo = repository()
        assert repo is not None, f"no clone of Nerogar/OneTrainer with {COMMIT}"
        git_sources(repo, COMMIT, SOURCES, into, lambda n: n.endswith(".py"))

    return built_once(HOME, build)


def _run(script: Path, *args: str) -> str:
    """A script of tests/ run in OneTrainer's source folder, its `modules` importable."""
    folder = home()
    env = {**os.environ, "PYTHONPATH": str(folder)}
    done = subprocess.run(
        [sys.executable, str(script), *args],
        env=env, cwd=folder, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"{script.name} failed in OneTrainer's source:\n{done.stderr[-4000:]}"
    )
    return done.stdout


def load(configs: list[str], filters: list[dict[str, Any]]) -> dict[str, Any]:
    """Each exported config read as scripts/train.py reads it, with its concepts file as the data
    loader reads that, and the module names each layer filter selects (tests/onetrainer_check.py):
    what they hold."""
    request = json.dumps({"configs": configs, "filters": filters})
    return json.loads(_run(CHECK, request).strip().splitlines()[-1])


def facts() -> dict[str, Any]:
    """What OneTrainer's source at COMMIT accepts in a config, as names (onetrainer_facts.py)."""
    return json.loads(_run(FACTS, COMMIT))
