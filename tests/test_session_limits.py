"""PostgreSQL session limits: every herder connection carries a statement timeout and an
idle-in-transaction timeout (unless something else set them), so a runaway statement or a
replica frozen inside a transaction cannot stall the fleet. Both end as StoreUnavailable,
the error every edge already answers with one line, and the pool heals. Migrations lift the
statement timeout: a second server waits out the first one's migration."""

from __future__ import annotations

import secrets
import threading
from datetime import UTC, datetime
from urllib.parse import quote, urlsplit

import psycopg
import pytest
from psycopg import sql
from support.postgres import postgres_url_for
from support.waits import wait_for

from herder.core.errors import StoreUnavailable
from herder.core.model import JobSpec
from herder.store import Store, as_unavailable, open_store
from herder.store.postgres import _MIGRATION_LOCK, PostgresDriver, connect


def with_options(url: str, options: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}options={quote(options)}"


def test_an_idle_transaction_timeout_is_a_lost_session():
    error = psycopg.errors.IdleInTransactionSessionTimeout("terminating connection")
    unavailable = as_unavailable(error)
    assert isinstance(unavailable, StoreUnavailable)
    assert "terminating connection" in str(unavailable)


# -- on a real server ------------------------------------------------------------------------


def setting(store: Store, name: str) -> str:
    assert isinstance(store.driver, PostgresDriver)
    with store.driver.connection() as conn:
        row = conn.execute(f"SHOW {name}").fetchone()
    assert row is not None
    return str(row[name])


@pytest.mark.postgres
def test_herder_sessions_carry_the_default_limits(postgres_url):
    with open_store(postgres_url) as store:
        assert isinstance(store.driver, PostgresDriver)
        assert setting(store, "statement_timeout") == "1min"
        assert setting(store, "idle_in_transaction_session_timeout") == "1min"


@pytest.mark.postgres
def test_what_the_url_pgoptions_or_the_database_set_wins(postgres_server_url, postgres_url,
                                                         monkeypatch):
    """herder sets a limit only where nothing else did: the URL's options, PGOPTIONS and
    ALTER DATABASE ... SET (a DBA's choice) all keep theirs."""
    url = with_options(postgres_url, "-c statement_timeout=5s")
    with open_store(url, migrate=False) as store:
        assert isinstance(store.driver, PostgresDriver)
        assert setting(store, "statement_timeout") == "5s"
        assert setting(store, "idle_in_transaction_session_timeout") == "1min"
    monkeypatch.setenv("PGOPTIONS", "-c idle_in_transaction_session_timeout=0")
    with open_store(postgres_url, migrate=False) as store:
        assert isinstance(store.driver, PostgresDriver)
        assert setting(store, "idle_in_transaction_session_timeout") == "0"
        assert setting(store, "statement_timeout") == "1min"
    monkeypatch.delenv("PGOPTIONS")
    name = f"herder_limits_{secrets.token_hex(4)}"
    with psycopg.connect(postgres_server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            admin.execute(sql.SQL("ALTER DATABASE {} SET statement_timeout = '5min'").format(
                sql.Identifier(name)))
            with open_store(postgres_url_for(postgres_server_url, name)) as store:
                assert isinstance(store.driver, PostgresDriver)
                assert setting(store, "statement_timeout") == "5min"
                assert setting(store, "idle_in_transaction_session_timeout") == "1min"
        finally:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(name)))


@pytest.mark.postgres
def test_herders_own_connections_carry_them_too(postgres_url):
    """The LISTEN connection and the leader lease's are opened apart from the pool."""
    with connect(postgres_url) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("1min",)
        assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone() == ("1min",)


@pytest.mark.postgres
def test_a_service_files_options_are_kept(postgres_url, tmp_path, monkeypatch):
    """A URL naming a libpq service keeps what the service file says (its options were
    once hidden by herder's own)."""
    parts = urlsplit(postgres_url)
    services = tmp_path / "pg_service.conf"
    password = f"password={parts.password}\n" if parts.password else ""
    services.write_text(f"[herder-test]\nhost={parts.hostname}\nport={parts.port or 5432}\n"
                        f"user={parts.username}\n{password}dbname={parts.path.lstrip('/')}\n"
                        "options=-c statement_timeout=7s\n")
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    with open_store("postgresql://?service=herder-test", migrate=False) as store:
        assert isinstance(store.driver, PostgresDriver)
        assert setting(store, "statement_timeout") == "7s"
        assert setting(store, "idle_in_transaction_session_timeout") == "1min"


@pytest.mark.postgres
def test_a_runaway_statement_is_cancelled_and_the_pool_goes_on(postgres_url):
    limited = with_options(postgres_url, "-c statement_timeout=1s")
    with open_store(limited, migrate=False) as store:
        assert isinstance(store.driver, PostgresDriver)
        with pytest.raises(StoreUnavailable, match="statement timeout"), \
                store.driver.connection() as conn:
            conn.execute("SELECT pg_sleep(60)")
        now = datetime.now(UTC)
        [inserted] = store.job_insert([JobSpec(command=("true",))], now)
        assert store.job_get(inserted.job_id) is not None


@pytest.mark.postgres
def test_a_session_idle_in_a_transaction_is_ended_and_its_row_locks_freed(postgres_url):
    """A replica that stops inside a transaction (here: a thread that waits) holds a row
    lock; the server ends its session, another session can then update the row, and the
    frozen replica's next statement fails as StoreUnavailable, not as a bug."""
    with open_store(postgres_url) as store:
        [inserted] = store.job_insert([JobSpec(command=("true",))], datetime.now(UTC))
    job_id = inserted.job_id
    limited = with_options(postgres_url, "-c idle_in_transaction_session_timeout=300ms")
    with open_store(limited, migrate=False) as store, \
            psycopg.connect(postgres_url, autocommit=True) as other:
        assert isinstance(store.driver, PostgresDriver)

        def session_alive(pid: int) -> bool:
            row = other.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                (pid,)).fetchone()
            return row is not None and row[0] == 1

        with pytest.raises(StoreUnavailable, match="idle-in-transaction"), \
                store.driver.connection() as conn, conn.transaction():
            conn.execute("SELECT id FROM herder_jobs WHERE id = %s FOR UPDATE", (job_id,))
            pid = conn.info.backend_pid
            wait_for(lambda: not session_alive(pid), 30, "the idle session to be ended")
            # The row is free: this would wait on the lock (and fail) were it still held.
            other.execute("SET lock_timeout = '5s'")
            other.execute("UPDATE herder_jobs SET priority = 7 WHERE id = %s", (job_id,))
            conn.execute("SELECT 1")
        job = store.job_get(job_id)  # the pool replaced the dead connection
        assert job is not None and job.priority == 7


@pytest.mark.postgres
def test_a_migration_waits_for_another_past_the_statement_timeout(postgres_url):
    """Another server holds the migration lock for longer than the statement timeout (as
    its migration would); this server's migrate waits for it instead of failing."""
    impatient = with_options(postgres_url, "-c statement_timeout=300ms")
    outcome: list[object] = []

    def migrate() -> None:
        try:
            store = open_store(impatient)
        except BaseException as exc:  # reported to the test below
            outcome.append(exc)
            return
        store.close()
        outcome.append("migrated")

    with psycopg.connect(postgres_url, autocommit=True) as holder, \
            psycopg.connect(postgres_url, autocommit=True) as watcher:
        with holder.transaction():
            holder.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            thread = threading.Thread(target=migrate, daemon=True)
            thread.start()

            def waited_past_the_timeout() -> bool:
                assert not outcome, f"migrate ended while the lock was held: {outcome}"
                row = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory'"
                    " AND state = 'active' AND now() - query_start > interval '1 second'"
                    " AND datname = current_database()").fetchone()
                return row is not None and row[0] == 1

            wait_for(waited_past_the_timeout, 60, "the migration to wait 1 s on the lock")
        thread.join(60)
    assert outcome == ["migrated"]
