"""The environment LitGPT runs in for the tests (issue 39 items 2 and 3).

litgpt 0.5.13 pins huggingface_hub below 1.4, and torchmetrics (which its fine-tuning scripts
import) imports whatever transformers it finds, which with autofit's transformers 5.24 needs a
huggingface_hub LitGPT refuses. So LitGPT runs in a subprocess of autofit's Python whose
PYTHONPATH puts a folder of its own first: litgpt, what its CLI imports that autofit's environment
lacks (lightning, jsonargparse and its signature readers, torchmetrics), and the huggingface_hub,
transformers and tokenizers of LitGPT's own pins (its `extra`: transformers below 4.57), installed
there once with `pip --target --no-deps` and cached under the git-ignored .cache/ by version.
Everything else (torch, safetensors, yaml, ...) comes from autofit's environment after it; pip
never touches that environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cached_folders import pip_site

LITGPT = "0.5.13"
PINS = (
    f"litgpt=={LITGPT}",
    "lightning==2.6.6",  # litgpt: lightning>=2.6.1
    "lightning-utilities==0.15.3",  # lightning: <2.0,>=0.10.0
    "jsonargparse==4.41.0",  # litgpt: jsonargparse[signatures]<=4.41,>=4.37
    "docstring-parser==0.18.0",  # jsonargparse[signatures]
    "typeshed-client==2.15.0",  # jsonargparse[signatures]
    "torchmetrics==1.9.0",  # lightning: <3.0,>0.7.0; finetune/*.py import RunningMean
    "huggingface_hub==0.36.2",  # litgpt: <1.4,>=0.30; transformers 4.56: <1.0
    "transformers==4.56.2",  # litgpt[extra]: <4.57,>=4.51.3 (torchmetrics imports it)
    "tokenizers==0.22.2",  # transformers 4.56: >=0.22.0,<=0.23.0
)
ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / ".cache" / f"litgpt-{LITGPT}" / "site"
CHECK = Path(__file__).with_name("litgpt_check.py")


def site() -> Path:
    """The folder holding LitGPT and its pins (tests/cached_folders.py)."""
    return pip_site(SITE, PINS)


def run(args: list[str], cwd: Path, timeout: int = 600) -> str:
    """`python ARGS` in LitGPT's environment, offline (nothing downloaded): what it printed, or an
    AssertionError with the end of its errors."""
    env = {
        **os.environ,
        "PYTHONPATH": str(site()),
        "HF_HUB_OFFLINE": "1",
        "CUDA_VISIBLE_DEVICES": "",  # Fabric's "auto" accelerator: the CPU
    }
    done = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"LitGPT failed ({' '.join(args[:3])} ...):\n{done.stderr[-4000:]}"
    return done.stdout


def litgpt(command: list[str], cwd: Path) -> str:
    """`litgpt COMMAND`, as LitGPT's console script runs it (its __main__)."""
    return run(["-m", "litgpt", *command], cwd)


def check(command: list[str], cwd: Path) -> str:
    """tests/litgpt_check.py COMMAND, in LitGPT's environment."""
    return run([str(CHECK), *command], cwd)
