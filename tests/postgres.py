"""A real PostgreSQL server for the tests, started by the test session itself: Debian's
`postgresql` package (`.ci/run` installs it), a cluster made by initdb in a temporary folder,
served on a free local port and a unix socket in that folder, stopped when the session ends.

initdb refuses to run as root, so as root the server runs as the package's `postgres` user, and
the folder is made its own. Tests import `postgres_server` (a session fixture) from here:
`from postgres import postgres_server` makes it available to a test module.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

USER = "autofit"  # the cluster's superuser; trust authentication, reachable only from here


def _bin_dir() -> Path | None:
    """Where initdb, pg_ctl and postgres are: Debian keeps them out of PATH, per version."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda path: int(Path(path).parts[-3]) if Path(path).parts[-3].isdigit() else 0,
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PostgresServer:
    """One cluster: `database()` makes a fresh database and gives its SQLAlchemy URL."""

    def __init__(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="autofit-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self._as: list[str] = []
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                pytest.skip("running as root and there is no `postgres` user to run PostgreSQL as")
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    def _run(self, *command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self._as, *command], capture_output=True, text=True, timeout=120, check=False
        )

    def start(self) -> None:
        initdb = self._run(
            str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", USER, "--auth=trust",
            "-E", "UTF8", "--no-instructions",
        )  # fmt: skip
        if initdb.returncode != 0:
            raise RuntimeError(f"initdb failed: {initdb.stderr.strip()}")
        self.resume()

    def resume(self) -> None:
        """Start the server on its cluster (made by `start`), on the same port."""
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        started = self._run(
            str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"),
            "-o", options, "-w", "-t", "60", "start",
        )  # fmt: skip
        if started.returncode != 0:
            log = (self.root / "log").read_text() if (self.root / "log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {started.stderr.strip()} {log[-2000:]}")

    def halt(self) -> None:
        """Stop the server as a crash or a failover does (`-m immediate`: connections cut, no
        clean shutdown), keeping its data for `resume`."""
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def database(self) -> str:
        """A new, empty database: what a user's fresh `storage=postgresql://...` is."""
        import sqlalchemy

        name = f"t_{uuid.uuid4().hex[:12]}"
        engine = sqlalchemy.create_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                connection.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
        finally:
            engine.dispose()
        return self.url(name)

    def stop(self) -> None:
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def running_server() -> Iterator[PostgresServer]:
    """A server of its own, for a test that stops and restarts it."""
    bin_dir = _bin_dir()
    if bin_dir is None:
        pytest.skip(
            "PostgreSQL's server programs (initdb, pg_ctl) are not installed: "
            "apt-get install postgresql (.ci/run does)"
        )
    server = PostgresServer(bin_dir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    with running_server() as server:
        yield server
