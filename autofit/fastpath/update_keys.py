"""What a configuration's setup and updates depend on, and where one search's scans keep them:
the light half of autofit/fastpath/shared_updates.py, which the search's own process reads
(the scheduler orders groups by it, the prober makes the directory) without importing torch.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autofit.knobs import registry
from autofit.records.probe import ProbeSpec


def update_knobs(knobs: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs a configuration's setup and updates depend on: all but those that change only
    its pass in this configuration (a knob autofit does not know is kept)."""
    known = registry()
    return {
        name: value
        for name, value in knobs.items()
        if name not in known or not known[name].only_in_the_pass(knobs)
    }


def updates_key(spec: ProbeSpec) -> str:
    """What a run's setup and updates depend on: its model, GPU and `update_knobs`."""
    kept = update_knobs(spec.knobs)
    text = json.dumps([spec.model, spec.gpu, kept], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def search_directory(owner: object) -> tuple[Path, Callable[[], object]]:
    """A directory for one search's shared updates, and what removes it now; it is removed with
    `owner` too, or when the process exits."""
    root = Path(tempfile.mkdtemp(prefix="autofit-updates-"))
    return root, weakref.finalize(owner, shutil.rmtree, root, ignore_errors=True)
