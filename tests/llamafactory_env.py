"""The environment LLaMA-Factory's own argument parsing runs in for the tests (issue 39 item 2).

LLaMA-Factory 0.9.5 pins transformers <= 5.6.0, peft <= 0.18.1, accelerate <= 1.11.0, trl <= 0.24.0
and datasets <= 4.0.0 (its wheel's Requires-Dist; extras/misc.py check_dependencies refuses
others when its parser is imported), which clash with autofit's own environment, so its parser
runs in a subprocess of autofit's Python whose PYTHONPATH puts a folder of its own first:
LLaMA-Factory and the pins of what its parser and model setup import, installed there once with
`pip --target --no-deps` and cached under the git-ignored .cache/ by version. Everything else
(torch, bitsandbytes, deepspeed, omegaconf, ...) comes from autofit's environment after it; pip
never touches that environment.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from cached_folders import pip_site

LLAMAFACTORY = "0.9.5"
PINS = (
    f"llamafactory=={LLAMAFACTORY}",
    # within LLaMA-Factory 0.9.5's own pins (Requires-Dist), the newest of each
    "transformers==5.6.0",
    "peft==0.18.1",
    "accelerate==1.11.0",
    "trl==0.24.0",  # its version is checked, not imported
    "datasets==4.0.0",  # imported by model/model_utils/quantization.py
    # transformers 5.6.0's own pins (dependency_versions_check at import)
    "tokenizers==0.22.2",
    "huggingface_hub==1.17.0",
    # imported by huggingface_hub 1.17
    "httpx==0.28.1",
    "httpcore==1.0.9",
)
ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / ".cache" / f"llamafactory-{LLAMAFACTORY}" / "site"
CHECK = Path(__file__).with_name("llamafactory_check.py")


def site() -> Path:
    """The folder holding LLaMA-Factory and its pins (tests/cached_folders.py)."""
    return pip_site(SITE, PINS)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse(jobs: list[dict[str, Any]], processes: int = 0) -> list[dict[str, Any]]:
    """LLaMA-Factory's get_train_args on each job's `config` (its model_name_or_path read from the
    local folder `model`: a config.json, nothing downloaded), then its model setup on the meta
    device; launched as `llamafactory-cli train` launches it: one process, or under torchrun with
    `processes` processes (FORCE_TORCHRUN, which DeepSpeed needs). What rank 0 saw of each, or an
    AssertionError with LLaMA-Factory's message."""
    env = {
        **os.environ,
        "PYTHONPATH": str(site()),
        "HF_HUB_OFFLINE": "1",
        "LLAMAFACTORY_VERBOSITY": "WARN",
    }
    command = [sys.executable, str(CHECK), json.dumps(jobs)]
    if processes:
        command[1:1] = [
            "-m", "torch.distributed.run", f"--nproc_per_node={processes}",
            f"--master_port={_free_port()}",
        ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"LLaMA-Factory rejected a config:\n{done.stderr[-4000:]}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("[")]
    return json.loads(lines[-1])
