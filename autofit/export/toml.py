"""A small TOML writer for the files sd-scripts reads (Python's tomllib only reads TOML).

It writes what those files hold: strings, booleans, integers, floats, lists of scalars, tables,
and arrays of tables nested one level (`[[datasets]]` with `[[datasets.subsets]]`).
"""

from __future__ import annotations

import json
from typing import Any


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string is a JSON string for these characters
    if isinstance(value, list):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as a TOML value")


def _is_table_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _body(table: dict[str, Any], prefix: str, lines: list[str], comment: str = "") -> None:
    for key, value in table.items():
        if not isinstance(value, dict) and not _is_table_list(value):
            lines.append(f"{key} = {_scalar(value)}" + (f"  # {comment}" if comment else ""))
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            lines += ["", f"[{name}]"]
            _body(value, f"{name}.", lines)
        elif _is_table_list(value):
            for item in value:
                lines += ["", f"[[{name}]]"]
                _body(item, f"{name}.", lines)


def dumps(data: dict[str, Any], comment: str = "") -> str:
    """`data` as TOML; `comment` goes at the end of each line of the top-level keys."""
    lines: list[str] = []
    _body(data, "", lines, comment)
    return "\n".join(lines).lstrip("\n") + "\n"
