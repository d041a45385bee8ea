"""The one error hierarchy. The CLI turns an `AutofitError` into one line and its exit code."""

import difflib
import signal


class AutofitError(Exception):
    """A problem the user can fix; its message is the whole explanation, on one line."""

    exit_code = 1


class ConfigError(AutofitError):
    """Bad input: an unknown name, a value a setting cannot take, a malformed override."""

    exit_code = 2


class NothingToSearch(AutofitError):
    """Every combination of a search space is invalid: no probe to run."""


# Characters of a user's value an error message quotes: a value read from a file can be as long
# as the file, and the message is one line.
SHOWN = 60


def shown(value: object) -> str:
    """`repr(value)` for an error message, cut to SHOWN characters (and the length it had)."""
    text = repr(value)
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text)} characters)"


def suggest(word: str, options: list[str]) -> str:
    """The words an error adds for a near miss: ` (did you mean 'rtx4090'?)`, or nothing. A
    family's name alone (`sana`, `a100`) offers its members, up to three; else the closest
    spelling."""
    close = [o for o in options if word and o.lower().startswith(word.lower())]
    if not close or len(close) > 3:
        close = difflib.get_close_matches(word, options, n=1)
    if not close:
        return ""
    quoted = [f"'{o}'" for o in close]
    listed = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
    return f" (did you mean {listed}?)"


class ProbeNotFinished(AutofitError):
    """A probe that ended for a reason of autofit's own (the search was interrupted, or the fork
    server running it died twice), not of the configuration's: it is not the configuration's
    answer, so it is never recorded, and a rerun measures it again."""


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP reached autofit: raised in the main thread by the CLI's handler,
    a KeyboardInterrupt so that no `except Exception` on the way out swallows it. `note` is what
    the interrupted command adds to its one line (for a search: what is saved and how to resume)."""

    def __init__(self, signum: int) -> None:

        self.signum = signum
        self.signal_name = signal.Signals(signum).name
        self.note = ""
        super().__init__(self.signal_name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention for a process ended by a signal


def yaml_error(source: object, exc: Exception) -> ConfigError:
    """A YAML file that does not parse, in one line: where (line and column, as editors count)
    and what the parser found."""
    where = getattr(exc, "problem_mark", None)
    at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
    return ConfigError(f"{source}: not valid YAML{at}: {problem}")
