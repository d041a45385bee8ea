"""The environment axolotl's own config validation runs in for the tests (issue 39 item 2).

axolotl 0.19.0 pins transformers 5.16.1, peft 0.20.0, accelerate 1.13.0 and more, which clash with
autofit's own environment, so its validation runs in a subprocess of autofit's Python whose
PYTHONPATH puts a folder of its own first: axolotl and the pins of the libraries its validation
imports (its wheel's Requires-Dist), installed there once with `pip --target --no-deps` and cached
under the git-ignored .cache/ by version. Everything else (torch, bitsandbytes, numpy, ...) comes
from autofit's environment after it; pip never touches that environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cached_folders import pip_site

AXOLOTL = "0.19.0"
PINS = (
    f"axolotl=={AXOLOTL}",
    # axolotl 0.19.0's own pins of what its validate_config and normalize_config import
    "transformers==5.16.1",
    "huggingface_hub==1.17.0",
    "datasets==4.8.4",
    "accelerate==1.13.0",
    "peft==0.20.0",
    "pydantic==2.12.5",
    "pydantic-core==2.41.5",  # pydantic 2.12.5's own pin
    # imported by huggingface_hub 1.17 and axolotl's loaders, unpinned by axolotl
    "httpx==0.28.1",
    "httpcore==1.0.9",
    "addict==2.4.0",
)
ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / ".cache" / f"axolotl-{AXOLOTL}" / "site"
CHECK = Path(__file__).with_name("axolotl_check.py")


def site() -> Path:
    """The folder holding axolotl and its pins (tests/cached_folders.py)."""
    return pip_site(SITE, PINS)


def validate(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """axolotl's validate_config and normalize_config on each job's `config`, its base_model read
    from the local folder `model` (a config.json; nothing downloaded), for `n_gpu` GPUs of
    `compute_capability`: the normalized configs, or an AssertionError with axolotl's message."""
    env = {
        **os.environ,
        "PYTHONPATH": str(site()),
        "HF_HUB_OFFLINE": "1",
        "AXOLOTL_DO_NOT_TRACK": "1",
    }
    done = subprocess.run(
        [sys.executable, str(CHECK), json.dumps(jobs, default=str)],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, f"axolotl rejected a config:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])
