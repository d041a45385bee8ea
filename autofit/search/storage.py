"""Opening a study's storage when many workers start at once.

Optuna creates its tables (and the study) on first use, with nothing to stop two processes doing
it together: on a fresh SQLite file one of them fails with "table ... already exists" or
"database is locked", on PostgreSQL with a unique violation in the catalog. So the first open is
done under a lock the database's users share: an advisory lock on PostgreSQL (held by a
connection of its own for just the open), an flock on the SQLite file's folder (a folder, not a
lock file beside the database: nothing is left behind). Anything else (MySQL, a journal file,
which locks itself) and any error the lock does not prevent are retried (autofit/search/retry.py,
which also rides out a storage that is away and names one that is broken).

SQLite writes one transaction at a time; several workers each wait up to `SQLITE_TIMEOUT_S` for
the write lock (pysqlite's default is 5 s). A pooled PostgreSQL connection is checked before use
(`pool_pre_ping`): after a server restart the pool's connections are dead, and each would
otherwise fail its next call once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autofit.command_line import command, override
from autofit.errors import AutofitError, ConfigError
from autofit.search.retry import PATIENCE_S, retrying

SQLITE_TIMEOUT_S = 60
PG_CONNECT_TIMEOUT_S = 10  # a server that does not answer (a partition) is away, not hanging
# pg_advisory_lock takes a 64-bit key shared by every client of the database: one fixed key for
# "autofit is creating Optuna's schema or a study".
_PG_LOCK_KEY = zlib.crc32(b"autofit: optuna schema and studies")


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

    engine = sqlalchemy.create_engine(
        url,
        poolclass=sqlalchemy.pool.NullPool,
        connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S},
    )
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
    if _is_postgres(url):
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
    if _is_postgres(url):
        kwargs["pool_pre_ping"] = True
        kwargs["connect_args"] = {"connect_timeout": PG_CONNECT_TIMEOUT_S}
    return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)


def _is_postgres(url: str) -> bool:
    return url.split(":", 1)[0].split("+", 1)[0] == "postgresql"


def shown(url: str) -> str:
    """The URL as messages show it: a password in it is masked."""
    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
    except Exception:  # not a database URL (journal:PATH): nothing to hide
        return url
    return parsed.render_as_string(hide_password=True) if parsed.password else url


def check_url(url: str) -> None:
    """A storage URL's common slips, named with what to write: a bare path (no scheme) and
    `postgres://` (SQLAlchemy knows PostgreSQL only as `postgresql://`)."""
    scheme = url.split("://", 1)[0] if "://" in url else None
    if scheme is None and not url.startswith("journal:"):
        raise ConfigError(
            f"storage={url} names no scheme; write {command([override('storage', f'sqlite:///{url}')])} "
            "(an SQLite file), storage=postgresql://user@host/db or storage=journal:PATH (a "
            "journal file)"
        )
    if scheme is not None and scheme.split("+", 1)[0] == "postgres":
        fixed = "postgresql" + url[len("postgres") :]
        raise ConfigError(
            f"storage={url}: SQLAlchemy names PostgreSQL 'postgresql'; write "
            f"{command([override('storage', fixed)])}"
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
            f"cannot open the study storage {shown(url)}: no PostgreSQL driver for {scheme} ({exc}); "
            'install autofit\'s: pip install "autofit[cluster]" (psycopg 3, what SQLAlchemy '
            "uses for postgresql://)"
        )
    return (
        f"cannot open the study storage {shown(url)}: its database driver is not installed ({exc})"
    )


def open_study(
    url: str,
    name: str,
    directions: list[str],
    attrs: dict[str, Any] | None = None,
    patience_s: float = PATIENCE_S,
) -> Any:
    """The study `name` in the storage at `url`, created (with Optuna's tables) if missing, and
    with `attrs` set as its user attributes: safe to call from many processes at once, and
    waiting up to `patience_s` for a storage that is away."""
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
        return retrying(attempt, shown(url), patience_s)
    except ImportError as exc:
        raise AutofitError(_missing_driver(url, exc.__cause__ or exc)) from None
    except AutofitError:
        raise
    except Exception as exc:  # the storage URL is the user's: report it, not a traceback
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AutofitError(f"cannot open the study storage {shown(url)}: {first}") from None
