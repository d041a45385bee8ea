"""The commands autofit prints for the user to run (a study's `rerun` line, a probe that measures
a run again, an export's command), written so that they run as printed.

Two quotings, one inside the other: each setting is a Hydra override whose value Hydra reads
back as the very value (a name with `;`, `'`, `,` or `=` must be quoted in Hydra's own grammar,
hydra/grammar/OverrideLexer.g4: `study='a;b'`; `2024` or `true` as a name too, which Hydra
would read as a number or a boolean), and each word is then quoted for the shell.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Iterable
from typing import Any

from autofit.units import value as text


def override(key: str, value: Any) -> str:
    """`key=value`, with the value bare where Hydra reads its text back as `value` (a name, a
    number, a boolean), else single-quoted as Hydra's grammar quotes a string."""
    bare = f"{key}={text(value)}"
    if _reads_back(bare, value):
        return bare
    assert isinstance(value, str), f"{bare} does not read back as {value!r}"
    return f"{key}={_quoted(value)}"


def key_of(override: str) -> str:
    """The setting an override sets: `study` of `study='a;b'`, `gpu.memory_mib` of
    `+gpu.memory_mib=1`."""
    return override.partition("=")[0].lstrip("+~")


def command(words: Iterable[str]) -> str:
    """The words as one shell command line, each quoted where the shell would split or expand it:
    in double quotes where nothing in the word is special there (easier to read around the
    single quotes of Hydra's: "study='a;b'"), else as `shlex.quote` does."""
    return " ".join(_shell(word) for word in words)


# What a POSIX shell still reads inside double quotes: expansions, escapes, the closing quote,
# and `!` (history, in an interactive bash).
_SPECIAL_IN_DOUBLE_QUOTES = re.compile(r'[$`"!]|\\([$`"\\\n]|$)')


def _shell(word: str) -> str:
    quoted = shlex.quote(word)
    if quoted == word or _SPECIAL_IN_DOUBLE_QUOTES.search(word):
        return quoted
    return f'"{word}"'


def _quoted(value: str) -> str:
    """`value` in single quotes as Hydra unquotes it: a backslash is taken as an escape only in
    a run of them before a quote (doubled there), a quote is escaped, and `${`, which OmegaConf
    would resolve as an interpolation inside quotes too, is escaped as OmegaConf escapes it."""
    body = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    body = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, body)
    return "'" + body.replace("${", "\\${") + "'"


def _reads_back(written: str, value: Any) -> bool:
    """Whether Hydra parses the override `written` to exactly `value`, of the same type, and
    OmegaConf leaves it as it is (no interpolation)."""
    from hydra.errors import HydraException

    try:
        parsed = _parser().parse_override(written).value()
    except HydraException:
        return False
    if isinstance(parsed, str) and "${" in parsed:
        return False
    return type(parsed) is type(value) and parsed == value


@functools.cache
def _parser() -> Any:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()
