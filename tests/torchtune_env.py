"""The environment torchtune's own config machinery runs in for the tests (issue 39 item 2).

torchtune 0.6.1 pins torchdata 0.11.0 and imports torchao's `torchao.dtypes.nf4tensor`, which
torchao 0.18 (autofit's) has moved, and sentencepiece and tiktoken, which autofit's environment
lacks. So its checks run in a subprocess of autofit's Python whose PYTHONPATH puts a folder of its
own first: torchtune and those few, installed there once with `pip --target --no-deps` and
cached under the git-ignored .cache/ by version. Everything else it imports (torch, omegaconf,
datasets, huggingface_hub, bitsandbytes, transformers for Adafactor, ...) comes from autofit's
environment after it; pip never touches that environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cached_folders import pip_site

TORCHTUNE = "0.6.1"
PINS = (
    f"torchtune=={TORCHTUNE}",
    "torchdata==0.11.0",  # torchtune 0.6.1's own pin
    # torchtune 0.6.1 leaves these unpinned: the torchao of its release, whose nf4tensor module its
    # LoRA layers import, and the tokenizer libraries its tokenizers module imports at once
    "torchao==0.10.0",
    "sentencepiece==0.2.3",
    "tiktoken==0.14.0",
)
ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / ".cache" / f"torchtune-{TORCHTUNE}" / "site"
CHECK = Path(__file__).with_name("torchtune_check.py")


def site() -> Path:
    """The folder holding torchtune and its pins (tests/cached_folders.py)."""
    return pip_site(SITE, PINS)


def check(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """torchtune's checks on each job's `config` (tests/torchtune_check.py says which): what
    they read back, or an AssertionError with torchtune's message."""
    env = {**os.environ, "PYTHONPATH": str(site()), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(CHECK), json.dumps(jobs)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, f"torchtune rejected a config:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])
