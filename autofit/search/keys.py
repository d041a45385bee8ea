"""What makes two probes, two scans or two pruned notes the same: the keys a study files them
under, readable by every autofit that wrote or reads the study.

A key leaves out every knob at its registry default, so a study written before a knob existed
(which ran it at that default) still finds its probes; keys stored by an older autofit, which
listed every knob, are read the same way (`normalized_key`).
"""

from __future__ import annotations

import json
from typing import Any

from autofit.knobs import REGISTRY
from autofit.records.probe import ScanWindow


def significant(knobs: dict[str, Any]) -> dict[str, Any]:
    """The knobs that make a run differ from the default one: a knob at its default says nothing
    a study predating the knob did not run (a knob this autofit does not know is kept)."""

    def at_default(name: str, value: Any) -> bool:
        default = REGISTRY[name].default
        return value == default and type(value) is type(default)

    return {k: v for k, v in knobs.items() if k not in REGISTRY or not at_default(k, v)}


def probe_key(
    knobs: dict[str, Any],
    backend: str,
    budget_bytes: int,
    model: str,
    gpu: str,
    host_budget_bytes: int | None = None,
) -> str:
    """What makes two probes the same probe: a study reuses a finished one only under this key,
    so a changed preset (`model` is its fingerprint), GPU entry or budget measures again. A host
    budget is part of the key only when stated: a probe without one has the key it had before
    autofit counted host memory."""
    key = {"knobs": significant(knobs), "backend": backend, "budget": budget_bytes,
           "model": model, "gpu": gpu}  # fmt: skip
    if host_budget_bytes is not None:
        key["host_budget"] = host_budget_bytes
    return json.dumps(key, sort_keys=True)


def scan_key(
    knobs: dict[str, Any], lo: int, hi: int, *fingerprints: Any, window: ScanWindow | None = None
) -> str:
    """What makes two scans (every batch from `lo` to `hi` of one structure) the same scan: the
    probe key of the structure (`fingerprints` as `probe_key` takes them), its batch size
    replaced by the range, and the least batch and the tolerance of its window
    (autofit/records/probe.py ScanWindow; none: the key a scan had before it reported one). Not the
    window's floor, which depends on what the search knew when it asked: the study keeps it with
    the scan (WINDOW_FLOOR_ATTR), and the search looks for itself below it."""
    structure = {k: v for k, v in knobs.items() if k != "batch_size"}
    key = json.loads(probe_key(structure, *fingerprints))
    key["scan"] = [lo, hi]
    if window is not None:
        key["window"] = [window.min_batch, window.tolerance]
    return json.dumps(key, sort_keys=True)


def pruned_key(knobs: dict[str, Any]) -> str:
    return json.dumps({"knobs": significant(knobs), "pruned": True}, sort_keys=True)


def normalized_key(key: str) -> str:
    """A stored key as this autofit writes it (older ones listed every knob)."""
    try:
        data = json.loads(key)
    except ValueError:
        return key
    if not isinstance(data, dict) or not isinstance(data.get("knobs"), dict):
        return key
    return json.dumps({**data, "knobs": significant(data["knobs"])}, sort_keys=True)
