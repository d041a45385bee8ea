"""A trainer's words for a value: `Say` what to write, or `Refuse` with the reason.

The vocabulary every declaration speaks to the export targets: a knob's words for each value
(autofit/knobs/base.py) and a model family's trainer for each target (autofit/families/base.py).
It sits on the ground floor, torch-free and importing nothing of autofit's, so that both can.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Say:
    """A trainer's words for a value: `settings` in the trainer's own names (what a key means is
    the target's layout: a config file's key, a command-line flag, `section.key` in a nested
    file), `note` for what the user must do, `warning` where the trainer cannot say it and the run
    is the measured one all the same (it picks its own fused attention kernel, say), and `files`
    to write beside the config (name -> (text, description))."""

    settings: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""
    warning: str = ""
    files: Mapping[str, tuple[str, str]] = field(default_factory=dict)


def say(note: str = "", warning: str = "", **settings: Any) -> Say:
    """`Say` with the settings as keyword arguments: say(optimizer_type="AdamW8bit")."""
    return Say(settings=settings, note=note, warning=warning)


@dataclass(frozen=True)
class Refuse:
    """The trainer cannot run this value as measured (the run would differ, or use more memory).
    `offers` says what the trainer can run instead; for a knob with a closed set of values it is
    worked out from the knob's own words when left empty."""

    why: str
    offers: str = ""
