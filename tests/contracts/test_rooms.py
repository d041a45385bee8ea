"""Rooms of one idea: no module of autofit over 500 lines, no function over 80, so that a reader
takes in one idea at a time (a module that outgrows it is split along its ideas, not trimmed)."""

from __future__ import annotations

import ast
from pathlib import Path

import autofit

ROOT = Path(autofit.__file__).parent
MODULE_LINES, FUNCTION_LINES = 500, 80


def _modules() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def test_no_module_is_over_500_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MODULE_LINES
    }
    assert not long, long


def test_no_function_is_over_80_lines() -> None:
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if lines > FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = lines
    assert not long, long
