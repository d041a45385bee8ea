"""Every emulation of someone else's system opens with what it leaves out: right after the
docstring's first paragraph (what it is), a paragraph beginning "Known limitations:". The modules
are listed from the package, so a new emulation is held to it the day it is added."""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import pytest

import autofit.emulations as emulations

PACKAGE = Path(emulations.__file__).parent
MODULES = sorted(m.name for m in pkgutil.iter_modules([str(PACKAGE)]))
OPENING_LINES = 25  # where "opens with" ends: a reader sees it without scrolling


def test_the_package_lists_the_emulations() -> None:
    assert {"zero", "fsdp", "fsdp1", "nvme", "nf4_layout", "bnb_layout"} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_each_emulation_opens_with_its_known_limitations(module: str) -> None:
    docstring = ast.get_docstring(ast.parse((PACKAGE / f"{module}.py").read_text()))
    assert docstring, f"autofit/emulations/{module}.py has no docstring"
    lines = docstring.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Known limitations:")]
    assert starts, f"autofit/emulations/{module}.py says no 'Known limitations:'"
    start = starts[0]
    assert start < OPENING_LINES, (
        f"autofit/emulations/{module}.py: 'Known limitations' at line {start + 1} of its "
        f"docstring, not in the first {OPENING_LINES}"
    )
    paragraphs_before = "\n".join(lines[:start]).strip().split("\n\n")
    assert start > 0 and lines[start - 1] == "" and len(paragraphs_before) == 1, (
        f"autofit/emulations/{module}.py: 'Known limitations' should be the paragraph right "
        "after the first one (what the module is)"
    )
