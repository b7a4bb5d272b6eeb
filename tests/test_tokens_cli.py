"""`herder token create|list|revoke`, host tokens, the v6 migration, and `herder server`
refusing to run open on the network."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from support.cli import error_line, ok, run_herder, run_many
from support.store import migrate_up_to, raw_execute

from herder.core.access import token_hash
from herder.core.model import HostRecord, Scope
from herder.store import open_store

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def listed(tmp_path, url, *extra: str) -> list[dict]:
    return json.loads(ok(run_herder("token", "list", "--json", *extra, cwd=tmp_path,
                                    db=url)).stdout)


def test_create_prints_the_token_once_and_stores_only_its_hash(tmp_path, store_url):
    created = ok(run_herder("token", "create", "--scope", "submit", "--name", "ci",
                            "--job-types", "dev-issue,review-pr", "--priority-floor", "20",
                            cwd=tmp_path, db=store_url))
    secret = created.stdout.strip()
    assert secret.startswith("hdr_") and len(created.stdout.splitlines()) == 1
    assert "shown once" in created.stderr
    [view] = listed(tmp_path, store_url)
    assert (view["name"], view["scope"], view["job_types"], view["priority_floor"]) == (
        "ci", "submit", ["dev-issue", "review-pr"], 20)
    assert secret not in json.dumps(view)
    with open_store(store_url) as store:
        stored = store.token_get(token_hash(secret))
        assert stored is not None and stored.id == view["id"]
    table = ok(run_herder("token", "list", cwd=tmp_path, db=store_url)).stdout
    header, row = table.splitlines()
    assert header.split() == ["ID", "NAME", "SCOPE", "HOST", "LIMITS", "CREATED", "REVOKED"]
    assert row.split()[:6] == [str(view["id"]), "ci", "submit", "types",
                               "dev-issue,review-pr;", "priority"], row
    assert secret not in table


def test_allow_adhoc_is_stored_and_listed(tmp_path, store_url):
    """Issue 23: only a submit token made with --allow-adhoc runs ad-hoc commands."""
    ok(run_herder("token", "create", "--scope", "submit", "--name", "shell", "--allow-adhoc",
                  cwd=tmp_path, db=store_url))
    ok(run_herder("token", "create", "--scope", "submit", "--name", "plain", cwd=tmp_path,
                  db=store_url))
    views = {view["name"]: view for view in listed(tmp_path, store_url)}
    assert (views["shell"]["allow_adhoc"], views["plain"]["allow_adhoc"]) == (True, False)
    table = ok(run_herder("token", "list", cwd=tmp_path, db=store_url)).stdout
    [shell] = [line for line in table.splitlines() if " shell " in line]
    assert "ad-hoc commands" in shell
    [plain] = [line for line in table.splitlines() if " plain " in line]
    assert "ad-hoc" not in plain


def test_revoke_stops_a_token_and_list_shows_it_only_with_all(tmp_path, store_url):
    ok(run_herder("token", "create", "--scope", "read", cwd=tmp_path, db=store_url))
    [view] = listed(tmp_path, store_url)
    assert ok(run_herder("token", "revoke", str(view["id"]), cwd=tmp_path,
                         db=store_url)).stdout.strip() == f"token {view['id']} revoked"
    assert listed(tmp_path, store_url) == []
    [revoked] = listed(tmp_path, store_url, "--all")
    assert revoked["revoked_at"] is not None
    again = run_herder("token", "revoke", str(view["id"]), cwd=tmp_path, db=store_url)
    assert again.returncode == 2 and "no live token" in error_line(again)


@pytest.mark.parametrize(("args", "field"), [
    (("--scope", "agent"), "--host"),
    (("--scope", "admin", "--host", "alpha"), "--host"),
    (("--scope", "read", "--job-types", "x"), "--job-types"),
    (("--scope", "submit", "--job-types", " , "), "--job-types"),
    (("--scope", "agent", "--host", "ghost"), "no host"),
    (("--scope", "root"), "--scope"),
    (("--scope", "admin", "--allow-adhoc"), "--allow-adhoc"),
    (("--scope", "read", "--allow-adhoc"), "--allow-adhoc"),
])
def test_bad_token_requests_exit_2_and_create_nothing(tmp_path, sqlite_url, args, field):
    with open_store(sqlite_url) as store:
        store.host_insert(HostRecord(label="alpha", ram_total_gb=8), NOW)
    result = run_herder("token", "create", *args, cwd=tmp_path, db=sqlite_url)
    assert result.returncode == 2 and field in error_line(result), result.stderr
    assert result.stdout == ""
    assert listed(tmp_path, sqlite_url, "--all") == []


def test_host_token_rotates_and_host_remove_revokes(tmp_path, sqlite_url):
    first = ok(run_herder("host", "add", "alpha", "--ram", "8", cwd=tmp_path,
                          db=sqlite_url)).stdout.strip()
    second = ok(run_herder("host", "token", "alpha", cwd=tmp_path, db=sqlite_url)).stdout.strip()
    with open_store(sqlite_url) as store:
        old, new = store.token_get(token_hash(first)), store.token_get(token_hash(second))
        assert old is not None and old.revoked_at is not None
        assert new is not None and new.revoked_at is None
        assert (new.scope, new.host) == (Scope.AGENT, "alpha")
        host = store.host_get("alpha")
        assert host is not None and host.has_token
    ok(run_herder("host", "remove", "alpha", cwd=tmp_path, db=sqlite_url))
    with open_store(sqlite_url) as store:
        gone = store.token_get(token_hash(second))
        assert gone is not None and gone.revoked_at is not None


def test_migration_6_moves_host_tokens_into_the_token_table(blank_store_url, monkeypatch):
    with open_store(blank_store_url, migrate=False) as store:
        t = migrate_up_to(store, monkeypatch, 5)
        raw_execute(store, blank_store_url, [
            ("INSERT INTO herder_hosts (label, ram_total_gb, token_hash, created_at, updated_at)"
             " VALUES (%s, 8, %s, %s, %s)", ("alpha", token_hash("hdr_old-alpha"), t(1), t(2))),
            ("INSERT INTO herder_hosts (label, ram_total_gb, created_at, updated_at)"
             " VALUES (%s, 8, %s, %s)", ("beta", t(1), t(2))),
        ])
        monkeypatch.undo()
        assert 6 in store.migrate()
        moved = store.token_get(token_hash("hdr_old-alpha"))
        assert moved is not None
        assert (moved.scope, moved.host, moved.name, moved.revoked_at) == (
            Scope.AGENT, "alpha", "host:alpha", None)
        assert [t.host for t in store.token_list()] == ["alpha"]
        hosts = {h.label: h.has_token for h in store.host_list()}
        assert hosts == {"alpha": True, "beta": False}


def test_server_refuses_the_network_without_an_admin_token(tmp_path, sqlite_url):
    open_on_network, insecure_on_network = run_many([
        ("server", "--listen", "0.0.0.0:1"),
        ("server", "--listen", "0.0.0.0:1", "--insecure-no-auth"),
    ], cwd=tmp_path, db=sqlite_url, env={"HERDER_API_TOKEN": ""})
    assert open_on_network.returncode == 2
    assert "herder token create --scope admin" in error_line(open_on_network)
    assert insecure_on_network.returncode == 2
    assert "--insecure-no-auth" in error_line(insecure_on_network)
