"""The source ai-toolkit's own config loader runs from in the tests (issue 39 item 2).

ai-toolkit is not on PyPI: its loader is read from its repository at the commit the export is
pinned to, the Python files of `toolkit/`, `jobs/` and `extensions_built_in/` (the process classes
and the model registry tests/ai_toolkit_facts.py reads) and requirements_base.txt, taken out of a
local clone (`git archive`; the clone is AI_TOOLKIT_REPO, else the mirror this workplace keeps)
into the git-ignored .cache/, with the two libraries `toolkit/config_modules.py` imports at its head that autofit's environment lacks,
installed beside them with `pip --target --no-deps` at ai-toolkit's own pins: PyAV (av 16.0.1,
imported by toolkit/audio/album_artwork.py) and oyaml (toolkit/config.py). torch, torchao,
diffusers, transformers and safetensors come from autofit's environment. Apart from them, in
quanto_pin/ where nothing imports it, optimum-quanto at ai-toolkit's pin (0.2.4; autofit's is
newer, with one more qtype): the facts read its qtype names.

One stand-in: `torchaudio`. No torchaudio build for autofit's torch 2.13 exists (the newest on
PyPI, 2.11.1, fails to load its _torchaudio library against it), and config_modules.py calls it
only in GenerateImageConfig's audio writer (torchaudio.save), which no config class runs when it
is constructed. The stand-in module raises if anything touches it, so a use would fail the test.
Built atomically: a half-built folder from an interrupted run is never taken for a built one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cached_folders import built_once, clone_with, git_sources, pip_install

COMMIT = "27a03a91f23eb1b757d5ec2e80ee3e129cfcc350"
PINS = ("av==16.0.1", "oyaml==1.0")  # ai-toolkit's requirements_base.txt pins av; oyaml unpinned
QUANTO_PIN = "optimum-quanto==0.2.4"  # requirements_base.txt's (tests/ai_toolkit_facts.py checks)
SOURCES = ("toolkit", "jobs", "extensions_built_in")  # their Python files
MIRROR = Path("/work/.mirror/ostris+ai-toolkit/repo")
ROOT = Path(__file__).resolve().parent.parent
LAYOUT = 2  # raised whenever what the folder holds changes, so an older one is not taken for it
HOME = ROOT / ".cache" / f"ai-toolkit-{COMMIT[:8]}.{LAYOUT}"
CHECK = Path(__file__).with_name("ai_toolkit_check.py")
FACTS = Path(__file__).with_name("ai_toolkit_facts.py")
STAND_IN = '''"""Stand-in for torchaudio (tests/ai_toolkit_env.py says why): any use fails."""


def __getattr__(name):
    raise AssertionError(f"ai-toolkit's config classes used torchaudio.{name}")
'''


def repository() -> Path | None:
    """The local clone of ai-toolkit holding the pinned commit, if there is one."""
    given = os.environ.get("AI_TOOLKIT_REPO")
    return clone_with(COMMIT, ([Path(given)] if given else []) + [MIRROR])


def _build(into: Path) -> None:
    repo = repository()
    assert repo is not None, f"no clone of ostris/ai-toolkit with {COMMIT}"
    # Python files only: the repository's large weights may be absent from a clone
    git_sources(repo, COMMIT, SOURCES, into, lambda n: n.endswith(".py"))
    git_sources(repo, COMMIT, ["requirements_base.txt"], into, lambda n: True)
    pip_install(into / "site", PINS)
    pip_install(into / "quanto_pin", [QUANTO_PIN])
    (into / "stand_in" / "torchaudio").mkdir(parents=True)
    (into / "stand_in" / "torchaudio" / "__init__.py").write_text(STAND_IN)


def home() -> Path:
    """The folder holding ai-toolkit's sources at COMMIT, its pins and the stand-in, built once
    (tests/cached_folders.py)."""
    return built_once(HOME, _build)


def _run(script: Path, *args: str) -> str:
    """A script of tests/ run in ai-toolkit's source folder, its imports resolved there first."""
    folder = home()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(folder), str(folder / "site"), str(folder / "stand_in")]
        ),
        "HF_HUB_OFFLINE": "1",
    }
    done = subprocess.run(
        [sys.executable, str(script), *args],
        env=env, cwd=folder, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"{script.name} failed in ai-toolkit's source:\n{done.stderr[-4000:]}"
    )
    return done.stdout


def load(configs: list[str]) -> list[dict[str, Any]]:
    """Each exported job read by ai-toolkit's get_config and its process's sections constructed
    as its sd_trainer process constructs them (tests/ai_toolkit_check.py); what they hold."""
    return json.loads(_run(CHECK, json.dumps(configs)).strip().splitlines()[-1])


def facts() -> dict[str, Any]:
    """What ai-toolkit's source at COMMIT accepts in a job, as names (tests/ai_toolkit_facts.py)."""
    return json.loads(_run(FACTS, COMMIT))
