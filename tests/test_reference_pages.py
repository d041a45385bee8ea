"""The generated reference pages (docs/knobs.md, docs/export.md) are what autofit/reference/
writes from the registries now: a knob, a value, a rule, a trainer's words or an export target
changed without regenerating them fails here, naming the command that rewrites them (the
generator tries everything in a fixed order, so any process writes the same pages). And every
relative link of the README and the handbook leads to a file and a heading that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autofit.reference import COMMAND, pages

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def generated() -> dict[Path, str]:
    return pages()


@pytest.mark.long
@pytest.mark.parametrize("name", ["knobs.md", "export.md"])
def test_a_committed_reference_page_is_what_the_generator_writes(
    name: str, generated: dict[Path, str]
) -> None:
    path = ROOT / "docs" / name
    assert path.exists(), f"docs/{name} is missing: run `{COMMAND}` to write it"
    expected = generated[path]
    if path.read_text() != expected:
        pairs = zip(path.read_text().splitlines(), expected.splitlines(), strict=False)
        first = next((i for i, (a, b) in enumerate(pairs) if a != b), len(expected.splitlines()))
        pytest.fail(
            f"docs/{name} is stale (first difference at line {first + 1}): run `{COMMAND}` to "
            "rewrite it from the registries, and commit the result"
        )


def _anchors(text: str) -> set[str]:
    """GitHub's anchors for a Markdown file's headings (lower case, punctuation dropped, spaces
    as hyphens), outside code blocks."""
    found: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def _documents() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "benchmarks" / "results").glob("*.md")),
    ]


@pytest.mark.parametrize("document", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(document: Path) -> None:
    text = document.read_text()
    broken = []
    for target in LINK.findall(re.sub(r"```.*?```", "", text, flags=re.S)):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        linked = (document.parent / path).resolve() if path else document
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked.read_text()):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{document.relative_to(ROOT)}: {', '.join(broken)}"
