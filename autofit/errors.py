"""The one error hierarchy. The CLI turns an `AutofitError` into one line and its exit code."""

import difflib


class AutofitError(Exception):
    """A problem the user can fix; its message is the whole explanation, on one line."""

    exit_code = 1


class ConfigError(AutofitError):
    """Bad input: an unknown name, a value a setting cannot take, a malformed override."""

    exit_code = 2


def suggest(word: str, options: list[str]) -> str:
    """The words an error adds for a near miss: ` (did you mean 'rtx4090'?)`, or nothing."""
    close = difflib.get_close_matches(word, options, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""
