"""Short content hashes of configuration entries: a study reuses a probe only when the preset and
GPU entry it ran against are unchanged."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def fingerprint(data: dict[str, Any]) -> str:
    """A 16-hex-digit hash of a JSON-able mapping, independent of key order."""
    text = json.dumps(data, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
