"""Shared helpers: specs for shipped presets without going through the CLI, and the CLI as a
user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from autofit.gpus import load_gpu
from autofit.models import load_preset
from autofit.probe.build import make_spec
from autofit.probe.spec import ProbeSpec


def spec(model: str, gpu: str = "a40", backend: str = "simulate", **knobs: Any) -> ProbeSpec:
    return make_spec(load_preset(model), load_gpu(gpu), knobs, backend=backend, timeout_s=300)


def autofit(
    *args: str, cwd: Path, pythonpath: Path | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """`autofit <args>` in a fresh interpreter, run in `cwd`; `pythonpath` makes a user's own
    modules importable, as `model.entry` needs."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath)} if pythonpath else None
    return subprocess.run(
        [sys.executable, "-m", "autofit", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
