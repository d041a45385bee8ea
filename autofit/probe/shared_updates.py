"""A configuration's setup and updates, traced once for the scans of one search.

A scan assembles a structure that differs from its group's first only in its update (the
optimizer, an EMA copy) from the first's pass and its own setup and updates, traced alone
(autofit/backends/simulate.py `traced_updates`). Those do not depend on knobs that change nothing
but the pass (checkpointing, the resolution, the attention kernel: `Knob.only_in_the_pass`), so
a search that scans AdamW 8-bit at two resolutions, with and without checkpointing, needs its
setup and updates once, not four times: `SharedUpdates` keeps each, keyed by the configuration
less those knobs, in a directory its scans share (one per search, in subprocesses that may run
at once). Whether a trace comes from there or is traced here, the log assembled from it is the
same (tests/test_shared_updates.py).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import tempfile
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autofit.paths import write_atomically
from autofit.records.probe import ProbeSpec

if TYPE_CHECKING:
    from autofit.backends.simulate import Updates


def update_knobs(knobs: Mapping[str, Any]) -> dict[str, Any]:
    """The knobs a configuration's setup and updates depend on: all but those that change only
    its pass in this configuration (a knob autofit does not know is kept)."""
    from autofit.knobs import registry

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


class SharedUpdates:
    """Setup-and-update traces by `updates_key`, in `root` (None: kept nowhere, each traced)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self.traced = self.reused = 0

    def updates(self, spec: ProbeSpec) -> Updates | None:
        """`spec`'s setup and updates: kept ones where another scan of the search traced them,
        else traced now (and kept). None where its updates cannot run without a pass."""
        from autofit.backends.simulate import traced_updates

        path = self.root / f"{updates_key(spec)}.pickle" if self.root else None
        if path is not None and path.exists():
            self.reused += 1
            return pickle.loads(path.read_bytes())
        updates = traced_updates(spec)
        self.traced += 1
        if path is not None and updates is not None:
            write_atomically(path, pickle.dumps(updates))
        return updates


def search_directory(owner: object) -> tuple[Path, Callable[[], object]]:
    """A directory for one search's shared updates, and what removes it now; it is removed with
    `owner` too, or when the process exits."""
    root = Path(tempfile.mkdtemp(prefix="autofit-updates-"))
    return root, weakref.finalize(owner, shutil.rmtree, root, ignore_errors=True)
