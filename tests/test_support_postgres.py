"""The private cluster helper itself: it starts, survives an immediate restart and a stop/start
at the same URL, and is gone after close()."""

from __future__ import annotations

import psycopg
import pytest
from support.postgres import PostgresCluster


def select_one(url: str) -> int:
    with psycopg.connect(url, connect_timeout=5) as conn:
        row = conn.execute("SELECT 1").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.postgres
def test_cluster_restarts_and_stops_at_the_same_url(private_postgres: PostgresCluster):
    url = private_postgres.url
    assert url.startswith("postgresql://postgres@127.0.0.1:")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (value int)")
        conn.execute("INSERT INTO kept VALUES (7)")
        private_postgres.restart(mode="immediate")
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")  # the restart cut this connection
    assert private_postgres.url == url
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT value FROM kept").fetchone() == (7,)
    private_postgres.stop()
    assert not private_postgres.running
    with pytest.raises(psycopg.OperationalError):
        select_one(url)
    private_postgres.start()
    assert select_one(url) == 1
    # Only loopback: the server listens on 127.0.0.1 and nothing else.
    with psycopg.connect(url) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)


@pytest.mark.postgres
def test_close_removes_the_cluster_and_keeps_its_log(tmp_path, private_postgres):
    cluster = PostgresCluster(tmp_path / "second")
    cluster.start()
    directory = cluster.directory
    assert select_one(cluster.url) == 1
    cluster.close()
    assert not directory.exists()
    assert "database system is ready" in (tmp_path / "second" / "postgres.log").read_text()
