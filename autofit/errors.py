"""The one error hierarchy. The CLI turns an `AutofitError` into one line and its exit code."""


class AutofitError(Exception):
    """A problem the user can fix; its message is the whole explanation, on one line."""

    exit_code = 1


class ConfigError(AutofitError):
    """Bad input: an unknown name, a value a setting cannot take, a malformed override."""

    exit_code = 2
