"""PostgreSQL for the tests: where the shared test server is and the backends a store test
runs on (conftest builds its fixtures from these), and a private cluster for tests that stop,
restart or kill the database.

The shared test server (conftest's `postgres_server_url`) must never be restarted, so tests of
outages start their own cluster: `initdb` into a fresh directory, listening on 127.0.0.1 at a
free port only, with its unix socket inside that directory, trust authentication and fsync off.

PostgreSQL refuses to run as root, so under root every `initdb`/`pg_ctl` runs as the `postgres`
OS user, and the cluster lives in a directory that user owns under the system temp dir (pytest's
tmp_path sits in a root-only 0700 directory that user cannot enter). `root` (usually tmp_path)
gets a symlink to the cluster directory while it exists and a copy of the server log after
`close()`, so a failed test shows what the database did.

Binaries: `HERDER_TEST_PG_BIN`, else /usr/lib/postgresql/15/bin, else the directory of `initdb`
on PATH.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from support.ports import free_port

POSTGRES_ENV = "HERDER_TEST_POSTGRES"
DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
HERDER_TABLES = ("herder_jobs", "herder_events")  # herder_attempts is a view of events
# The backends a store test runs on; the postgres half carries the `postgres` marker.
BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]

BIN_ENV = "HERDER_TEST_PG_BIN"
DEFAULT_BIN = Path("/usr/lib/postgresql/15/bin")
SERVICE_USER = "postgres"  # who runs the cluster when the tests run as root
SUPERUSER = "postgres"
START_TIMEOUT = 60  # seconds for pg_ctl -w; a loaded 2-core machine recovers slowly
PORT_ATTEMPTS = 5


def postgres_url_for(url: str, database: str, **query: str) -> str:
    """`url` pointed at another database, with extra query options (e.g. `options=...`)."""
    parts = urlsplit(url)
    extra = "&".join(f"{key}={value}" for key, value in query.items())
    joined = "&".join(part for part in (parts.query, extra) if part)
    return urlunsplit(parts._replace(path=f"/{database}", query=joined))


def empty_herder_tables(url: str) -> None:
    """Empty every herder table but the schema version (so later migrations are covered
    too) and restart the ids: a test starts from what it writes, not from what the test
    before it on this xdist worker left in the session database."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")
        tables = [row[0] for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            " AND tablename LIKE 'herder\\_%' AND tablename <> 'herder_schema'")]
        assert set(HERDER_TABLES) <= set(tables), tables
        conn.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY").format(
            sql.SQL(", ").join(sql.Identifier(t) for t in tables)))


def postgres_bin_dir() -> Path | None:
    """Where initdb and pg_ctl are, or None when PostgreSQL is not installed."""
    configured = os.environ.get(BIN_ENV)
    candidates = [Path(configured)] if configured else [DEFAULT_BIN]
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).parent)
    return next((path for path in candidates if (path / "initdb").is_file()), None)


def missing_requirement() -> str | None:
    """Why a private cluster cannot start here, or None when it can."""
    if postgres_bin_dir() is None:
        return f"initdb not found (install PostgreSQL 15 or set {BIN_ENV})"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVICE_USER)
        except KeyError:
            return f"running as root and there is no {SERVICE_USER!r} OS user to run postgres"
    return None


class PostgresCluster:
    """One private PostgreSQL cluster; `start()` it, `url` reaches it, `close()` removes it."""

    def __init__(self, root: Path) -> None:
        bin_dir = postgres_bin_dir()
        if bin_dir is None:
            raise RuntimeError(missing_requirement())
        self.bin_dir = bin_dir
        self.root = root
        self.port = free_port()
        self._as_service_user = os.geteuid() == 0
        self.directory = Path(tempfile.mkdtemp(prefix="herder-pg-"))
        if self._as_service_user:
            account = pwd.getpwnam(SERVICE_USER)
            os.chown(self.directory, account.pw_uid, account.pw_gid)
        self.directory.chmod(0o700)
        self.data = self.directory / "data"
        self.log = self.directory / "server.log"
        root.mkdir(parents=True, exist_ok=True)
        self._link = root / "postgres-cluster"
        with contextlib.suppress(OSError):
            self._link.symlink_to(self.directory)
        self._initialised = False

    @property
    def url(self) -> str:
        """The superuser's URL of the `postgres` database; stays the same across restarts."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Initialise (first time) and start; returns once connections are accepted."""
        if not self._initialised:
            self._run("initdb", "--pgdata", str(self.data), "--username", SUPERUSER,
                      "--auth", "trust", "--encoding", "UTF8", "--locale", "C", "--no-sync")
            self._initialised = True
        for attempt in range(PORT_ATTEMPTS):
            self._write_settings()
            result = self._pg_ctl("start", "--wait", "--timeout", str(START_TIMEOUT),
                                  "--log", str(self.log), check=False)
            if result.returncode == 0:
                return
            if "already in use" not in self.log_text() or attempt == PORT_ATTEMPTS - 1:
                raise RuntimeError(f"pg_ctl start failed:\n{result.stdout}\n{self.log_tail()}")
            self.port = free_port()  # someone took the port between choosing and binding it

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`pg_ctl stop -m mode`: smart, fast or immediate)."""
        self._pg_ctl("stop", "--wait", "--timeout", str(START_TIMEOUT), "--mode", mode)

    def restart(self, mode: str = "immediate") -> None:
        """Restart in place; `immediate` drops every connection with no checkpoint, as a crash
        would, and the server runs crash recovery before accepting connections again."""
        self._pg_ctl("restart", "--wait", "--timeout", str(START_TIMEOUT), "--mode", mode,
                     "--log", str(self.log))

    @property
    def running(self) -> bool:
        return self._pg_ctl("status", check=False).returncode == 0

    def close(self) -> None:
        """Stop at once (if running), keep the log beside `root`, remove the cluster."""
        if self._initialised and self.running:
            self._pg_ctl("stop", "--wait", "--mode", "immediate", check=False)
        with contextlib.suppress(OSError):
            if self.log.exists():
                shutil.copyfile(self.log, self.root / "postgres.log")
        with contextlib.suppress(OSError):
            self._link.unlink()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> PostgresCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- diagnostics -------------------------------------------------------------------------

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    # -- internals ---------------------------------------------------------------------------

    def _write_settings(self) -> None:
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.directory}'",
            "fsync": "off",
            "full_page_writes": "off",
            "shared_buffers": "'32MB'",
            "max_connections": "100",
        }
        # fsync off is safe here: a restart kills processes, never the OS. synchronous_commit
        # stays on, or an immediate restart would forget commits a test has seen succeed.
        text = "".join(f"{name} = {value}\n" for name, value in settings.items())
        conf = self.data / "postgresql.auto.conf"
        conf.write_text("# written by tests/support/postgres.py\n" + text)
        self._give_to_service_user(conf)

    def _give_to_service_user(self, path: Path) -> None:
        if self._as_service_user:
            account = pwd.getpwnam(SERVICE_USER)
            os.chown(path, account.pw_uid, account.pw_gid)

    def _pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run("pg_ctl", *args, "--pgdata", str(self.data), check=check)

    def _run(self, program: str, *args: str, check: bool = True
             ) -> subprocess.CompletedProcess[str]:
        environment = {"PATH": f"{self.bin_dir}:/usr/bin:/bin", "LANG": "C", "LC_ALL": "C"}
        command: Sequence[str] = [str(self.bin_dir / program), *args]
        result = subprocess.run(
            command, check=False, cwd=self.directory, env=environment, capture_output=True,
            text=True,
            user=SERVICE_USER if self._as_service_user else None, timeout=START_TIMEOUT + 30,
            # The server must outlive neither the test nor a Ctrl-C of it; its own session keeps
            # a terminal's SIGINT away so close() decides how it stops.
            start_new_session=True,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{program} {' '.join(args)} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}\n{self.log_tail()}")
        return result


@pytest.fixture
def private_postgres(tmp_path: Path) -> Iterator[PostgresCluster]:
    """A started private cluster for this test alone; skipped loudly (failed under CI=true)
    when PostgreSQL's binaries are missing."""
    reason = missing_requirement()
    if reason is not None:
        message = f"private PostgreSQL cluster UNAVAILABLE: {reason} -- outage tests NOT RUN"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    cluster = PostgresCluster(tmp_path / "postgres")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
