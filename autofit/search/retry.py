"""Riding out a study storage that is busy or away for a while, and naming one that is broken.

Every call autofit makes to a study's storage goes through `retrying`, which sorts a failure
(`fault`) into one of three kinds by what the database driver says, never by guessing:

- **away**: the database cannot answer now but will (a PostgreSQL server restarting or failing
  over, a dropped connection, an SQLite file another process holds locked past the driver's
  timeout). Retried with jittered exponential back-off, for up to `patience_s` (120 s by default:
  a PostgreSQL restart or failover takes seconds to a minute); one notice when an outage has
  lasted a couple of seconds, one when it ends. Past the patience: `StorageUnavailable`, one line.
- **race**: two workers created the same table or study at once; a few quick retries settle it.
- **broken**: retrying cannot help (a damaged or foreign file, a full disk, no permission, a
  database that does not exist): `StorageBroken` at once, in one line that says which.

Anything else is not the storage's doing (Optuna refusing to change a finished trial, a bug) and
is raised as it is.

The clock of the last outage is kept (`last_outage_end`): a worker that could not read the study
for a while has not seen other workers' heartbeats beat, and must not hold that against them
(autofit/search/claims.py Liveness).
"""

from __future__ import annotations

import errno
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from autofit.errors import AutofitError

log = logging.getLogger(__name__)
T = TypeVar("T")

AWAY, RACE, BROKEN = "away", "race", "broken"
PATIENCE_S = 120.0  # the default of the search's storage_patience_s
RACE_TRIES = 6  # pauses of about 0.1, 0.2, 0.4, 0.8, 1.6 s: some 3 s in all
FIRST_PAUSE_S, LONGEST_PAUSE_S = 0.1, 5.0
NOTICE_AFTER_S = 2.0  # a busy SQLite file waits this long routinely: no notice before


class StorageError(AutofitError):
    """The study storage failed in a way autofit cannot ride out; the message says how."""


class StorageBroken(StorageError):
    """Damaged, full, not permitted, not there: retrying would not help."""


class StorageUnavailable(StorageError):
    """Away for longer than the patience allows."""


# SQLite's result codes by name (Python 3.11+ puts it on the exception: sqlite_errorname).
_SQLITE_AWAY = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_PROTOCOL", "SQLITE_SCHEMA")
_SQLITE_BROKEN = {
    "SQLITE_FULL": "the disk it is on is full",
    "SQLITE_CORRUPT": "it is damaged: a corrupt SQLite database",
    "SQLITE_NOTADB": "it is damaged: not an SQLite database",
    "SQLITE_READONLY": "it cannot be written: read-only (check the file's and its folder's permissions)",
    "SQLITE_PERM": "it cannot be written: no permission",
    "SQLITE_AUTH": "it cannot be written: no permission",
    "SQLITE_CANTOPEN": "it cannot be opened (check the path and its permissions)",
    "SQLITE_IOERR": "the disk failed to read or write it: an I/O error",
}
# Before Python 3.11 pysqlite gives only the message: SQLite's own words for the same codes.
_SQLITE_WORDS = {
    "database is locked": "SQLITE_BUSY",
    "database table is locked": "SQLITE_LOCKED",
    "disk is full": "SQLITE_FULL",
    "malformed": "SQLITE_CORRUPT",
    "file is not a database": "SQLITE_NOTADB",
    "readonly database": "SQLITE_READONLY",
    "unable to open database": "SQLITE_CANTOPEN",
    "disk i/o error": "SQLITE_IOERR",
}
# PostgreSQL's SQLSTATE classes and codes (psycopg's `sqlstate`).
_PG_AWAY_CLASSES = ("08",)  # connection exceptions
_PG_AWAY = {
    "57P01": "the server is shutting down",  # admin_shutdown
    "57P02": "the server crashed",  # crash_shutdown
    "57P03": "the server is starting up or shutting down",  # cannot_connect_now
    "53300": "it has too many connections",
    "40001": "a serialization failure",
    "40P01": "a deadlock between workers",
    "55P03": "a lock held by another worker",
}
_PG_BROKEN = {
    "53100": "the server's disk is full",
    "53200": "the server is out of memory",
    "3D000": "the database does not exist (create it first: createdb NAME)",
    "42501": "no permission (grant the user CREATE and USAGE on the database)",
    "57P04": "the database was dropped",
}
_PG_BROKEN_CLASSES = {"28": "the server refused the login (user or password)"}
_OS_BROKEN = {
    errno.ENOSPC: "the disk it is on is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EACCES: "no permission",
    errno.EPERM: "no permission",
    errno.EROFS: "it is on a read-only file system",
}


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception, what it wraps (SQLAlchemy's `orig`, Optuna's `from e`), and so on."""
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        stack += [getattr(current, "orig", None), current.__cause__, current.__context__]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__


def fault(exc: BaseException) -> tuple[str, str] | None:
    """(AWAY, RACE or BROKEN, what happened in a few words), or None: not the storage's fault."""
    for cause in _causes(exc):
        module = type(cause).__module__
        if module == "sqlite3":
            found = _sqlite_fault(cause)
            if found:
                return found
        elif module.startswith("psycopg"):
            return _postgres_fault(cause)
        elif isinstance(cause, OSError) and cause.errno is not None:
            return BROKEN, _OS_BROKEN.get(cause.errno, cause.strerror or _first_line(cause))
    for cause in _causes(exc):
        name = type(cause).__name__
        if type(cause).__module__.startswith("sqlalchemy") and getattr(
            cause, "connection_invalidated", False
        ):
            return AWAY, "the connection was dropped"
        if name in ("IntegrityError", "DuplicatedStudyError") or (
            name == "ProgrammingError" and "already exists" in str(cause)
        ):
            return RACE, _first_line(cause)  # two workers created the same table or study
    return None


def _sqlite_fault(exc: BaseException) -> tuple[str, str] | None:
    name = getattr(exc, "sqlite_errorname", None)
    if not isinstance(name, str):  # Python 3.10: SQLite's message is all there is
        text = str(exc).lower()
        name = next((code for words, code in _SQLITE_WORDS.items() if words in text), "")
    if name.startswith(_SQLITE_AWAY):
        return AWAY, "it is locked by another process"
    for code, words in _SQLITE_BROKEN.items():
        if name == code or name.startswith(code + "_"):
            return BROKEN, f"{words} ({_first_line(exc)})"
    return None


def _postgres_fault(exc: BaseException) -> tuple[str, str]:
    state = getattr(exc, "sqlstate", None) or ""
    if state in _PG_BROKEN:
        return BROKEN, _PG_BROKEN[state]
    if state[:2] in _PG_BROKEN_CLASSES:
        return BROKEN, f"{_PG_BROKEN_CLASSES[state[:2]]} ({_first_line(exc)})"
    if state in _PG_AWAY:
        return AWAY, _PG_AWAY[state]
    if not state or state[:2] in _PG_AWAY_CLASSES:
        # No SQLSTATE: the client could not reach the server (refused, closed, timed out).
        return AWAY, f"the server cannot be reached ({_first_line(exc)})"
    return BROKEN, _first_line(exc)


class _Outage:
    """The outage in progress, shared by every thread of this process: notices once, not per
    call, and the time the last one ended."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.since: float | None = None
        self.noticed = False
        self.ended_at = 0.0

    def failing(self, what: str, words: str, patience_s: float) -> None:
        with self._lock:
            now = time.monotonic()
            if self.since is None:
                self.since = now
            if not self.noticed and now - self.since >= NOTICE_AFTER_S:
                self.noticed = True
                log.warning(
                    "the study storage %s cannot be reached (%s); retrying for up to %.0f s",
                    what, words, patience_s,
                )  # fmt: skip

    def over(self, what: str) -> None:
        if self.since is None:  # the common case, without the lock
            return
        with self._lock:
            if self.since is None:
                return
            now = time.monotonic()
            if self.noticed:
                log.warning("the study storage %s is back after %.0f s", what, now - self.since)
            self.since, self.noticed, self.ended_at = None, False, now


_OUTAGE = _Outage()


def last_outage_end() -> float:
    """When (time.monotonic) this process last reached its storage again after failing to."""
    return _OUTAGE.ended_at


def retrying(action: Callable[[], T], what: str, patience_s: float = PATIENCE_S) -> T:
    """`action()`, run again while the storage `what` is away (for up to `patience_s` seconds,
    0: once) or two workers race; a broken storage, or one away longer, is a `StorageError`."""
    deadline: float | None = None
    for attempt in itertools.count():
        try:
            result = action()
        except Exception as exc:
            found = fault(exc)
            if found is None:
                raise
            kind, words = found
            if kind == BROKEN:
                raise StorageBroken(f"the study storage {what} failed: {words}") from None
            now = time.monotonic()
            deadline = now + patience_s if deadline is None else deadline
            if kind == RACE and attempt + 1 >= RACE_TRIES:
                raise StorageBroken(f"the study storage {what} failed: {words}") from None
            if now >= deadline:
                raise StorageUnavailable(
                    f"the study storage {what} could not be reached for {patience_s:.0f} s "
                    f"({words})"
                ) from None
            if kind == AWAY:
                _OUTAGE.failing(what, words, patience_s)
            pause = min(LONGEST_PAUSE_S, FIRST_PAUSE_S * 2**attempt) * (0.5 + random.random() / 2)
            time.sleep(max(0.0, min(pause, deadline - now)))
            continue
        _OUTAGE.over(what)
        return result
    raise AssertionError("unreachable")  # itertools.count() never ends
