"""Shared fixtures: an empty herder database on each backend, fresh for every test.

Backends:

* ``sqlite``: a new file under ``tmp_path``.
* ``postgres``: one database per test session (per xdist worker), created on the server
  that ``HERDER_TEST_POSTGRES`` names (default ``postgresql://postgres@127.0.0.1:5432/test``),
  migrated once, truncated before each test and dropped at the end. When the server cannot
  be reached, postgres tests are skipped with a loud banner; with ``CI`` set they fail.

Fixtures parametrized over both backends (``store``, ``store_url``, ``blank_store_url``)
carry the ``postgres`` marker on their postgres half, so ``-m "not postgres"`` runs SQLite only.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import sql
from support.postgres import (
    BACKENDS,
    DEFAULT_POSTGRES_URL,
    POSTGRES_ENV,
    empty_herder_tables,
    postgres_url_for,
)

from herder.core.urls import redact_url
from herder.store import Store, open_store

_postgres_unreachable: list[str] = []


# -- PostgreSQL server and session database ---------------------------------------------------


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    """URL of the PostgreSQL server to test against; skips (fails in CI) when unreachable."""
    url = os.environ.get(POSTGRES_ENV) or DEFAULT_POSTGRES_URL
    try:
        with psycopg.connect(url, connect_timeout=3, autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        reason = (
            f"PostgreSQL UNREACHABLE at {redact_url(url)}: {str(exc).strip()} -- postgres "
            f"tests NOT RUN (start a server or set {POSTGRES_ENV}; with CI set this fails)"
        )
        if os.environ.get("CI"):
            pytest.fail(reason, pytrace=False)
        _postgres_unreachable.append(reason)
        pytest.skip(reason)
    return url


@pytest.fixture(scope="session")
def postgres_database(postgres_server_url: str) -> Iterator[str]:
    """URL of a migrated database owned by this test session; dropped when it ends."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    name = f"herder_test_{worker}_{secrets.token_hex(4)}"
    with psycopg.connect(postgres_server_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = postgres_url_for(postgres_server_url, name)
        open_store(url).close()
        yield url
    finally:
        with psycopg.connect(postgres_server_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


# -- per-test databases -----------------------------------------------------------------------


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """URL of an empty, migrated SQLite file under tmp_path (`sqlite:////abs/path`)."""
    url = f"sqlite:///{tmp_path / 'herder.db'}"
    open_store(url).close()
    return url


@pytest.fixture
def postgres_url(postgres_database: str) -> str:
    """URL of the session database with the herder tables emptied and ids restarted."""
    empty_herder_tables(postgres_database)
    return postgres_database


@pytest.fixture(params=BACKENDS)
def store_url(request) -> str:
    """URL of an empty, migrated database, once per backend; for stores opened elsewhere."""
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """An open store on an empty database, once per backend; closed after the test."""
    with open_store(store_url) as opened:
        yield opened


@pytest.fixture(params=BACKENDS)
def blank_store_url(request, tmp_path) -> Iterator[str]:
    """URL of a database with no herder schema yet, once per backend.

    PostgreSQL gets a fresh schema in the session database, selected by `search_path`.
    """
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'blank.db'}"
        return
    database = request.getfixturevalue("postgres_database")
    schema = f"herder_blank_{secrets.token_hex(4)}"
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield postgres_url_for(
            database, urlsplit(database).path.lstrip("/"), options=f"-csearch_path%3D{schema}"
        )
    finally:
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def pytest_terminal_summary(terminalreporter) -> None:
    """Make an unreachable PostgreSQL impossible to miss in the summary."""
    if _postgres_unreachable:
        terminalreporter.section("PostgreSQL NOT TESTED", sep="!", red=True, bold=True)
        terminalreporter.line(_postgres_unreachable[0], red=True, bold=True)


# Shared fixtures that live beside their helpers.
from support.fleet import make_fleet  # noqa: E402, F401
from support.local import harness  # noqa: E402, F401
from support.postgres import private_postgres  # noqa: E402, F401
