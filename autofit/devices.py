"""What this machine's GPUs are, as far as it can be told without importing torch (seconds of
start-up): the backends and the knobs' rules both ask it."""

from __future__ import annotations

import os
from pathlib import Path


def nvidia_device_visible(proc: Path = Path("/proc/driver/nvidia/gpus")) -> bool:
    """Whether this process may see an NVIDIA GPU, known without torch: on Linux the driver lists
    each GPU under /proc/driver/nvidia/gpus, and CUDA_VISIBLE_DEVICES set to nothing (or -1)
    hides them all. Elsewhere (no /proc) it cannot be told: torch is asked."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    if not Path("/proc").is_dir():
        return True
    return proc.is_dir() and any(proc.iterdir())
