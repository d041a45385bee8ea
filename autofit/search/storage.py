"""Opening a study's storage when many workers start at once, and riding out a busy database.

Optuna creates its tables (and the study) on first use, with nothing to stop two processes doing
it together: on a fresh SQLite file one of them fails with "table ... already exists" or
"database is locked", on PostgreSQL with a unique violation in the catalog. So the first open is
done under a lock the database's users share: an advisory lock on PostgreSQL (held by a
connection of its own for just the open), an flock on the SQLite file's folder (a folder, not a
lock file beside the database: nothing is left behind). Anything else (MySQL, a journal file,
which locks itself) and any error the lock does not prevent are retried with a growing pause.

SQLite writes one transaction at a time; several workers each wait up to `SQLITE_TIMEOUT_S` for
the write lock (pysqlite's default is 5 s), and the few operations SQLite refuses at once (a
reader that would have to wait on a writer waiting on it) are retried by `retrying`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from autofit.errors import AutofitError, ConfigError

log = logging.getLogger(__name__)
T = TypeVar("T")

SQLITE_TIMEOUT_S = 60
# pg_advisory_lock takes a 64-bit key shared by every client of the database: one fixed key for
# "autofit is creating Optuna's schema or a study".
_PG_LOCK_KEY = zlib.crc32(b"autofit: optuna schema and studies")
RETRIES = 6  # pauses of about 0.1, 0.2, 0.4, 0.8, 1.6 s: some 3 s in all


def transient_errors() -> tuple[type[BaseException], ...]:
    """The errors a race between workers raises (and that an attempt moments later does not)."""
    import optuna
    from sqlalchemy import exc

    return (
        exc.OperationalError,  # SQLite: database is locked; PostgreSQL: deadlock detected
        exc.IntegrityError,  # two creators of one table, row or study
        exc.ProgrammingError,  # PostgreSQL: relation already exists
        optuna.exceptions.StorageInternalError,  # Optuna's wrapper of any of them
    )


def retrying(action: Callable[[], T], what: str = "the study storage") -> T:
    """`action()`, run again after a growing pause while it fails the way a busy database does."""
    transient = transient_errors()
    for attempt in range(RETRIES):
        try:
            return action()
        except transient as exc:
            if attempt == RETRIES - 1:
                raise
            log.debug("%s is busy (%s); trying again", what, exc)
            time.sleep((0.1 << attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")


@contextlib.contextmanager
def _sqlite_lock(path: str) -> Iterator[None]:
    folder = Path(path).resolve().parent
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield  # no folder to lock (a new one is made by SQLite, or fails there with its words)
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a filesystem without flock on folders (NFS): the retries remain
            pass
        yield
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def _postgres_lock(url: str) -> Iterator[None]:
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text(f"SELECT pg_advisory_lock({_PG_LOCK_KEY})"))
            try:
                yield
            finally:
                connection.execute(sqlalchemy.text(f"SELECT pg_advisory_unlock({_PG_LOCK_KEY})"))
    finally:
        engine.dispose()


def _opening_lock(url: str) -> contextlib.AbstractContextManager[None]:
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        return _sqlite_lock(url.removeprefix("sqlite:///"))
    if url.split(":", 1)[0].split("+", 1)[0] == "postgresql":
        return _postgres_lock(url)
    return contextlib.nullcontext()


def _backend(url: str) -> Any:
    import optuna

    if url.startswith("journal:"):  # a journal file, for several workers on a shared filesystem
        from optuna.storages.journal import JournalFileBackend

        return optuna.storages.JournalStorage(JournalFileBackend(url.removeprefix("journal:")))
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite:"):
        kwargs["connect_args"] = {"timeout": SQLITE_TIMEOUT_S}
    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)


def check_url(url: str) -> None:
    """A storage URL's common slips, named with what to write: a bare path (no scheme) and
    `postgres://` (SQLAlchemy knows PostgreSQL only as `postgresql://`)."""
    scheme = url.split("://", 1)[0] if "://" in url else None
    if scheme is None and not url.startswith("journal:"):
        raise ConfigError(
            f"storage={url} names no scheme; write storage=sqlite:///{url} (an SQLite file), "
            "storage=postgresql://user@host/db or storage=journal:PATH (a journal file)"
        )
    if scheme is not None and scheme.split("+", 1)[0] == "postgres":
        fixed = "postgresql" + url[len("postgres") :]
        raise ConfigError(
            f"storage={url}: SQLAlchemy names PostgreSQL 'postgresql'; write storage={fixed}"
        )


def storage_file(url: str) -> Path | None:
    """The file a storage URL keeps its studies in (an SQLite database, a journal), if any."""
    if url.startswith("journal:"):
        return Path(url.removeprefix("journal:"))
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        return Path(url.removeprefix("sqlite:///"))
    return None


def _missing_driver(url: str, exc: BaseException) -> str:
    scheme = url.split(":", 1)[0]
    if scheme.split("+", 1)[0] == "postgresql":
        return (
            f"cannot open the study storage {url}: no PostgreSQL driver for {scheme} ({exc}); "
            'install autofit\'s: pip install "autofit[cluster]" (psycopg 3, what SQLAlchemy '
            "uses for postgresql://)"
        )
    return f"cannot open the study storage {url}: its database driver is not installed ({exc})"


def open_study(
    url: str, name: str, directions: list[str], attrs: dict[str, Any] | None = None
) -> Any:
    """The study `name` in the storage at `url`, created (with Optuna's tables) if missing, and
    with `attrs` set as its user attributes: safe to call from many processes at once."""
    import optuna

    def attempt() -> Any:
        with _opening_lock(url):
            study = optuna.create_study(
                storage=_backend(url), study_name=name, directions=directions, load_if_exists=True
            )
            for key, value in (attrs or {}).items():
                study.set_user_attr(key, value)
            return study

    check_url(url)
    try:
        return retrying(attempt, f"the study storage {url}")
    except ImportError as exc:
        raise AutofitError(_missing_driver(url, exc.__cause__ or exc)) from None
    except AutofitError:
        raise
    except Exception as exc:  # the storage URL is the user's: report it, not a traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AutofitError(f"cannot open the study storage {url}: {first}") from None
