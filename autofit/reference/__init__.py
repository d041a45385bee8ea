"""The reference pages docs/knobs.md and docs/export.md, written from the registries.

Nothing on those pages is typed by hand: every knob's values, default, rules, hooks and trainer
words come from its declaration (`autofit.knobs.REGISTRY`), every target's files, launch command
and refusals from running the target itself (`autofit.export.TARGETS`) on one preset of each
model family (facts.py finds them; pages.py writes them). `python -m autofit.reference` rewrites
both pages; tests/test_reference_pages.py fails when a committed page differs from what this
autofit writes now.
"""

from __future__ import annotations

from pathlib import Path

from autofit.reference.facts import Facts
from autofit.reference.pages import COMMAND, export_page, knobs_page

DOCS = Path(__file__).resolve().parents[2] / "docs"


def pages() -> dict[Path, str]:
    """Each generated page and its text, as this autofit writes them now."""
    facts = Facts()
    return {DOCS / "knobs.md": knobs_page(facts), DOCS / "export.md": export_page(facts)}


def main() -> int:
    for path, text in pages().items():
        path.write_text(text)
        print(f"wrote {path}")
    return 0


__all__ = ["COMMAND", "main", "pages"]
