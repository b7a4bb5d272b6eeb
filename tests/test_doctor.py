"""`herder doctor`: the findings' lines and exit code (pure), every check run at once with a
hanging one cut at its time, and the real command against a healthy setup and each broken
piece (an unknown program, a store at an old schema, a database that never answers; for
--server a missing admin token, a webhook secret open to others, a missing run_as user; for
--agent what the server says the host runs, and each answer its checks' route may give)."""

from __future__ import annotations

import json
import os
import pwd
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.cli import UNREACHABLE_DB, run_herder
from support.ports import free_port
from support.store import migrate_up_to
from support.waits import wait_for
from test_tls import make_certificate

from herder.core.diagnosis import (
    Finding,
    Verdict,
    as_json,
    exit_code,
    line,
    ok,
    problem,
    summary,
    timed_out,
    warning,
)
from herder.services.doctor import run_checks
from herder.store import open_store

# -- the pure part ---------------------------------------------------------------------------


def test_a_finding_is_one_line_with_its_fix_and_the_names_line_up() -> None:
    assert line(ok("store", "sqlite:///x opens")) == "ok       store: sqlite:///x opens"
    assert line(problem("git", "not found\non PATH", "install  git")) == \
        "problem  git: not found on PATH (fix: install git)"
    assert line(warning("memory", "the watchdog", "delegate")).startswith("warning  memory: ")


def test_any_problem_makes_exit_1_and_warnings_do_not() -> None:
    assert exit_code([]) == 0
    assert exit_code([ok("a", "x"), warning("b", "y", "z")]) == 0
    assert exit_code([ok("a", "x"), problem("b", "y", "z")]) == 1
    findings = [ok("a", "x"), warning("b", "y", "z"), problem("c", "y", "z")]
    assert summary(findings) == "1 ok, 1 warning(s), 1 problem(s)"
    assert as_json(findings) == {"exit": 1, "checks": [
        {"name": "a", "verdict": "ok", "detail": "x", "fix": ""},
        {"name": "b", "verdict": "warning", "detail": "y", "fix": "z"},
        {"name": "c", "verdict": "problem", "detail": "y", "fix": "z"}]}


def test_an_error_never_shows_a_password() -> None:
    from herder.core.urls import redact_urls_in

    assert redact_urls_in("cannot open postgresql://herder:s3cret@db:5432/h: refused") == \
        "cannot open postgresql://herder:***@db:5432/h: refused"
    assert redact_urls_in("postgresql://herder@db/h") == "postgresql://herder@db/h"
    assert redact_urls_in("'postgresql://a:p4ss@db/h' or https://u:p@w:1/x") == \
        "'postgresql://a:***@db/h' or https://u:***@w:1/x"
    assert redact_urls_in("at http://[bad:s3cret@x y") == "at http://*** y"


def test_a_timed_out_check_is_a_problem() -> None:
    finding = timed_out("store", 2)
    assert finding.verdict is Verdict.PROBLEM and "no answer within 2s" in finding.detail


# -- every check at once ---------------------------------------------------------------------


def test_a_hanging_check_is_cut_and_never_blocks_the_others() -> None:
    release = threading.Event()
    started = threading.Event()

    def hangs() -> list[Finding]:
        started.set()
        release.wait()
        return [ok("hangs", "answered")]

    def fails() -> list[Finding]:
        raise RuntimeError("boom")

    try:
        findings = run_checks([("hangs", hangs), ("fine", lambda: [ok("fine", "yes")]),
                               ("fails", fails)], timeout=0.5)
    finally:
        release.set()
    assert started.is_set()
    assert [(f.name, f.verdict) for f in findings] == [
        ("hangs", Verdict.PROBLEM), ("fine", Verdict.OK), ("fails", Verdict.PROBLEM)]
    assert "no answer within 0.5s" in findings[0].detail
    assert "RuntimeError: boom" in findings[2].detail


# -- the real command ------------------------------------------------------------------------

HEALTHY = """\
[job_types.build]
command = ["sh", "-c", "true"]

[job_types.fix]
command = ["sh", "-c", "true"]
workspace = { repository = "https://example.invalid/{repo}.git", ref = "main" }
"""


def doctor(tmp_path: Path, *args: str, db: str, config: str = HEALTHY,
           env: dict[str, str] | None = None):
    path = tmp_path / "herder.toml"
    path.write_text(config)
    return run_herder("doctor", *args, cwd=tmp_path, db=db, config=path, env=env)


def verdicts(stdout: str) -> dict[str, str]:
    """Each check's name and verdict from the lines (the summary line left out)."""
    found = {}
    for text in stdout.splitlines()[:-1]:
        verdict, _, rest = text.partition("  ")
        found[rest.strip().split(":", 1)[0]] = verdict.strip()
    return found


def test_a_healthy_setup_passes_every_check(tmp_path: Path, sqlite_url: str) -> None:
    result = doctor(tmp_path, db=sqlite_url)
    assert result.returncode == 0, result.stdout + result.stderr
    found = verdicts(result.stdout)
    assert {name for name, verdict in found.items() if verdict != "ok"} <= {"memory"}
    assert {"config", "store", "program build", "program fix", "git", "memory",
            "escalation", "alerts"} <= found.keys()
    assert ("escalation: [fleet] escalation: light -> heavy; heavy -> orchestrator "
            "(past playwright 6 GB); playwright -> orchestrator; orchestrator -> none "
            "(the ceiling)") in result.stdout
    assert result.stdout.splitlines()[-1].endswith("0 problem(s)")
    as_data = doctor(tmp_path, "--json", db=sqlite_url)
    assert as_data.returncode == 0
    data = json.loads(as_data.stdout)
    assert data["exit"] == 0 and {c["name"] for c in data["checks"]} == found.keys()


def test_an_unknown_program_is_a_problem_naming_the_job_type(tmp_path: Path,
                                                             sqlite_url: str) -> None:
    config = HEALTHY + '\n[job_types.gone]\ncommand = ["no-such-program-herder", "{x}"]\n'
    result = doctor(tmp_path, db=sqlite_url, config=config)
    assert result.returncode == 1
    assert ("problem  program gone: 'no-such-program-herder' is not found on PATH (fix: "
            "install no-such-program-herder") in result.stdout
    assert verdicts(result.stdout)["program build"] == "ok"


def test_a_store_at_an_old_schema_says_to_migrate(tmp_path: Path, monkeypatch) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    with open_store(url, migrate=False) as store:
        migrate_up_to(store, monkeypatch, 2)
    monkeypatch.undo()
    result = doctor(tmp_path, db=url)
    assert result.returncode == 1
    assert "problem  store: " in result.stdout and "is at schema 2" in result.stdout
    assert "run `herder migrate`" in result.stdout


def test_a_bad_herder_toml_is_a_problem_not_a_crash(tmp_path: Path, sqlite_url: str) -> None:
    result = doctor(tmp_path, db=sqlite_url, config="[job_types.x]\ncommand = 3\n")
    assert result.returncode == 1
    assert result.stdout.startswith("problem  config: ")


@pytest.fixture
def silent_database() -> Iterator[str]:
    """A PostgreSQL URL whose port accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        yield f"postgresql://postgres:hunter2secret@127.0.0.1:{listener.getsockname()[1]}/x"
    finally:
        listener.close()


def test_a_database_that_never_answers_is_cut_at_the_timeout(tmp_path: Path,
                                                             silent_database: str) -> None:
    result = doctor(tmp_path, "--timeout", "1", db=silent_database)
    assert result.returncode == 1
    found = verdicts(result.stdout)
    assert found["store"] == "problem" and "no answer within 1s" in result.stdout
    assert found["program build"] == "ok" and found["alerts"] == "ok"
    assert "hunter2secret" not in result.stdout + result.stderr


def test_an_unreachable_database_is_a_problem_and_the_rest_still_run(tmp_path: Path) -> None:
    result = doctor(tmp_path, db=UNREACHABLE_DB)
    assert result.returncode == 1
    assert "problem  store: cannot connect to " in result.stdout
    assert "check that the database runs" in result.stdout
    assert verdicts(result.stdout)["program build"] == "ok"


def test_bad_options_exit_2(tmp_path: Path, sqlite_url: str) -> None:
    assert doctor(tmp_path, "--timeout", "0", db=sqlite_url).returncode == 2


# -- --server --------------------------------------------------------------------------------


def admin_token(tmp_path: Path, url: str) -> None:
    run_herder("token", "create", "--scope", "admin", "--name", "ops", cwd=tmp_path, db=url,
               check=True)


def test_a_healthy_server_passes_every_check(tmp_path: Path, postgres_url: str) -> None:
    admin_token(tmp_path, postgres_url)
    with open_store(postgres_url) as store:
        lease = store.leader_lease()
        assert lease.try_acquire()  # as a running server holds it
        try:
            result = doctor(tmp_path, "--server", db=postgres_url)
        finally:
            lease.release()
    assert result.returncode == 0, result.stdout + result.stderr
    found = verdicts(result.stdout)
    assert {name for name, verdict in found.items() if verdict != "ok"} <= {"memory"}
    assert {"store", "leader", "listen", "tls", "admin token", "webhooks"} <= found.keys()
    idle = doctor(tmp_path, "--server", db=postgres_url)
    assert idle.returncode == 0 and verdicts(idle.stdout)["leader"] == "warning"


def test_a_server_without_an_admin_token_is_a_problem(tmp_path: Path,
                                                      postgres_url: str) -> None:
    result = doctor(tmp_path, "--server", db=postgres_url)
    assert result.returncode == 1
    assert "problem  admin token: no admin token exists" in result.stdout
    assert "herder token create --scope admin" in result.stdout


def test_a_webhook_secret_open_to_others_is_a_problem(tmp_path: Path,
                                                      postgres_url: str) -> None:
    admin_token(tmp_path, postgres_url)
    secret = tmp_path / "gitea.secret"
    secret.write_text("s3cret-value-not-shown\n")
    secret.chmod(0o644)
    config = HEALTHY + ('\n[hooks.sources.gitea]\nkind = "gitea"\n'
                        'secret_file = "gitea.secret"\n')
    result = doctor(tmp_path, "--server", db=postgres_url, config=config)
    assert result.returncode == 1
    assert "problem  webhooks: " in result.stdout and "chmod 600" in result.stdout
    assert "s3cret-value-not-shown" not in result.stdout
    secret.chmod(0o600)
    fixed = doctor(tmp_path, "--server", db=postgres_url, config=config)
    assert verdicts(fixed.stdout)["webhooks"] == "ok"


def test_a_missing_run_as_user_is_a_problem(tmp_path: Path, postgres_url: str) -> None:
    admin_token(tmp_path, postgres_url)
    config = HEALTHY + '\n[runtime]\nrun_as = "no-such-user-herder"\n'
    result = doctor(tmp_path, "--server", db=postgres_url, config=config)
    assert result.returncode == 1
    assert "problem  run_as: no user 'no-such-user-herder' on this host" in result.stdout


# -- --agent ---------------------------------------------------------------------------------


def token_file(folder: Path, token: str, mode: int = 0o600) -> Path:
    path = folder / "agent-token"
    path.write_text(token + "\n")
    path.chmod(mode)
    return path


def agent_doctor(fleet, url: str, label: str, token_path: Path, *extra: str):
    return run_herder("doctor", "--agent", "--server", url, "--host", label,
                      "--token-file", str(token_path), *extra, cwd=fleet.root, db=fleet.db,
                      config=fleet.config)


ME = pwd.getpwuid(os.geteuid()).pw_name
"""The user the tests run as (root in CI)."""


def agent_unit(folder: Path, url: str, label: str, token_path: Path, user: str = ME) -> Path:
    """The unit `herder agent install-systemd` writes for `label` run as `user`: the doctor
    runs the server's preflights and probes only as its User= (root only when it says
    so)."""
    written = run_herder("agent", "install-systemd", "--server", url, "--host", label,
                         "--user", user, "--token-file", str(token_path), "--allow-plaintext",
                         cwd=folder, check=True).stdout
    path = folder / f"{label}-{user}.service"
    path.write_text(written)
    return path


def test_a_healthy_agent_passes_every_check(make_fleet, tmp_path: Path,
                                            sqlite_url: str) -> None:
    fleet = make_fleet(tmp_path, sqlite_url, extra=HEALTHY)
    token = fleet.add_host("doc-1", "--ram", "8")
    fleet.start_server()
    path = token_file(tmp_path, token)
    own = agent_unit(tmp_path, fleet.url, "doc-1", path)
    result = agent_doctor(fleet, fleet.url, "doc-1", path, "--unit", str(own))
    assert result.returncode == 0, result.stdout + result.stderr
    found = verdicts(result.stdout)
    assert {name for name, verdict in found.items() if verdict != "ok"} <= {"memory"}
    assert {"token", "server", "clock", "preflight build", "preflight fix", "git"} <= \
        found.keys()
    assert "accepted for host doc-1" in result.stdout
    assert found["job types"] == "ok" and "from the server" in result.stdout
    assert token not in result.stdout + result.stderr
    assert "ok       systemd unit: none at " in agent_doctor(
        fleet, fleet.url, "doc-1", path, "--unit", str(tmp_path / "absent.service")).stdout

    # The unit `herder agent install-systemd` writes matches; one for another host does not.
    assert f"ok       systemd unit: {own} matches" in result.stdout
    other = agent_doctor(fleet, fleet.url, "doc-1", path, "--unit",
                         str(agent_unit(tmp_path, fleet.url, "doc-2", path)))
    assert other.returncode == 1
    assert "problem  systemd unit: " in other.stdout
    assert "--host doc-2 where this check has doc-1" in other.stdout

    # The token file open to others, a token the server does not know: problems.
    path.chmod(0o644)
    opened = agent_doctor(fleet, fleet.url, "doc-1", path)
    assert opened.returncode == 1
    assert "problem  token: " in opened.stdout and "chmod 600" in opened.stdout
    assert token not in opened.stdout + opened.stderr
    wrong = agent_doctor(fleet, fleet.url, "doc-1", token_file(tmp_path, "hdr_" + "x" * 40))
    assert wrong.returncode == 1
    assert "problem  token: " in wrong.stdout and "refuses it for host doc-1" in wrong.stdout


def test_an_unreachable_server_is_a_problem(tmp_path: Path, sqlite_url: str) -> None:
    path = token_file(tmp_path, "hdr_" + "y" * 40)
    url = f"http://127.0.0.1:{free_port()}"
    result = run_herder("doctor", "--agent", "--server", url, "--host", "doc-1",
                        "--token-file", str(path), cwd=tmp_path, db=sqlite_url)
    assert result.returncode == 1
    assert f"problem  server: cannot reach {url}" in result.stdout
    assert verdicts(result.stdout)["token"] == "ok"


def test_agent_needs_a_server_and_a_host(tmp_path: Path, sqlite_url: str) -> None:
    assert run_herder("doctor", "--agent", "--host", "h", cwd=tmp_path,
                      db=sqlite_url).returncode == 2
    result = run_herder("doctor", "--agent", "--server", "http://127.0.0.1:1", cwd=tmp_path,
                        db=sqlite_url)
    assert result.returncode == 2 and "--host" in result.stderr
    alone = run_herder("doctor", "--server", "http://127.0.0.1:1", cwd=tmp_path, db=sqlite_url)
    assert alone.returncode == 2 and "a URL is for --agent" in alone.stderr


def test_a_tls_server_verifies_against_its_ca_and_not_another(make_fleet, tmp_path: Path,
                                                              sqlite_url: str) -> None:
    fleet = make_fleet(tmp_path, sqlite_url)
    token = fleet.add_host("doc-1", "--ram", "8")
    (tmp_path / "right").mkdir()
    (tmp_path / "other").mkdir()
    cert, key = make_certificate(tmp_path / "right")
    other, _ = make_certificate(tmp_path / "other")
    fleet.start_server("--tls-cert", str(cert), "--tls-key", str(key), wait=False)
    base = f"https://127.0.0.1:{fleet.port}"
    trust = ssl.create_default_context(cafile=str(cert))

    def answers() -> bool:
        try:
            return httpx.get(f"{base}/healthz", verify=trust, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(answers, 30, "the TLS server to answer /healthz", fleet.describe)
    path = token_file(tmp_path, token)
    good = agent_doctor(fleet, base, "doc-1", path, "--ca", str(cert))
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"the certificate verifies against {cert}" in good.stdout
    bad = agent_doctor(fleet, base, "doc-1", path, "--ca", str(other))
    assert bad.returncode == 1
    assert f"problem  server: the certificate of {base} does not verify against {other}" \
        in bad.stdout


def test_the_clock_offset_is_read_from_the_servers_date_header() -> None:
    from email.utils import formatdate

    from herder.services.doctor import clock_finding

    now = 1_800_000_000.0
    assert clock_finding(formatdate(now, usegmt=True), now - 0.2, now + 0.2) == \
        ok("clock", "+0s from the server's clock")
    behind = clock_finding(formatdate(now + 30, usegmt=True), now, now)
    assert behind.verdict is Verdict.PROBLEM and behind.detail.startswith("+30s")
    assert "timedatectl set-ntp true" in behind.fix
    assert clock_finding(None, now, now).verdict is Verdict.WARNING
    # --clock-tolerance: 30s off is fine within a minute, 3s off is not within 2s.
    assert clock_finding(formatdate(now + 30, usegmt=True), now, now, 60).verdict is Verdict.OK
    strict = clock_finding(formatdate(now + 3, usegmt=True), now, now, 2)
    assert strict == problem("clock", "+3s from the server's clock (more than 2s)",
                             strict.fix)


@pytest.mark.parametrize("value", ["0.5s", "0", "abc", "-3s", "2y"])
def test_a_bad_clock_tolerance_exits_2_naming_it(tmp_path: Path, sqlite_url: str,
                                                 value: str) -> None:
    result = run_herder("doctor", "--agent", "--server", "http://127.0.0.1:1", "--host", "h",
                        "--clock-tolerance", value, cwd=tmp_path, db=sqlite_url)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--clock-tolerance" in result.stderr


def probe_script(folder: Path, name: str, present: bool, refresh: bool) -> Path:
    path = folder / name
    said = json.dumps({"credentials_present": present, "has_refresh_token": refresh,
                       "access_expired": True})
    path.write_text(f"#!/bin/sh\necho '{said}'\n")
    path.chmod(0o755)
    return path


def test_an_agent_host_runs_what_the_server_says_not_its_own_herder_toml(
        make_fleet, tmp_path: Path, sqlite_url: str) -> None:
    """The job types allowed on the host (their preflights, git for a workspace) and the
    probes of its accounts come from the server (GET /api/v1/agent/LABEL/checks); the
    host's own herder.toml here names none of them. No account's variable crosses."""
    fleet = make_fleet(tmp_path, sqlite_url, extra=HEALTHY + (
        '\n[job_types.gone]\ncommand = ["no-such-program-herder", "{x}"]\n'))
    token = fleet.add_host("doc-1", "--ram", "8", "--job-types", "build,gone")
    other = fleet.add_host("doc-2", "--ram", "8")
    alive = probe_script(tmp_path, "alive-probe", True, True)
    dead = probe_script(tmp_path, "dead-probe", False, False)
    for name, probe in (("one", str(alive)), ("two", str(dead)),
                        ("three", "sh -c 'echo garbage'")):
        run_herder("account", "add", "doc-1", name, "--probe", probe, "--env",
                   "ACCOUNT_SECRET", cwd=fleet.root, db=fleet.db, config=fleet.config,
                   env={"ACCOUNT_SECRET": "s3cret-account-value"}, check=True)
    fleet.start_server()

    # The route: this host's definitions only, and no account's variables.
    own = httpx.get(f"{fleet.url}/api/v1/agent/doc-1/checks",
                    headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert own.status_code == 200, own.text
    body = own.json()
    assert set(body) == {"label", "job_types", "probes"}
    assert sorted(body["job_types"]) == ["build", "gone"]
    assert body["job_types"]["gone"]["preflight"]["argv"] == ["no-such-program-herder",
                                                              "--version"]
    assert sorted(body["probes"]) == ["one", "three", "two"]
    assert "s3cret-account-value" not in own.text and "ACCOUNT_SECRET" not in own.text
    # A host's token reads no other host's.
    for label, bearer in (("doc-2", token), ("doc-1", other)):
        refused = httpx.get(f"{fleet.url}/api/v1/agent/{label}/checks",
                            headers={"Authorization": f"Bearer {bearer}"}, timeout=10)
        assert refused.status_code == 403, refused.text
    assert httpx.get(f"{fleet.url}/api/v1/agent/doc-1/checks", timeout=10).status_code == 401

    # The doctor on the host, whose herder.toml is empty.
    host = tmp_path / "host"
    host.mkdir()
    (host / "herder.toml").write_text("")
    path = token_file(host, token)
    result = run_herder("doctor", "--agent", "--server", fleet.url, "--host", "doc-1",
                        "--token-file", str(path), "--unit",
                        str(agent_unit(host, fleet.url, "doc-1", path)), cwd=host,
                        config=host / "herder.toml")
    assert result.returncode == 1, result.stdout + result.stderr
    found = verdicts(result.stdout)
    assert found["job types"] == "ok" and "from the server: 2 preflight(s), 3 account " \
        "probe(s) for host doc-1" in result.stdout
    assert found["preflight build"] == "ok" and found["preflight gone"] == "problem"
    assert "preflight fix" not in found and "git" not in found  # fix is not allowed there
    assert (found["account one"], found["account two"], found["account three"]) == (
        "ok", "problem", "warning")
    assert "sign this account in again" in result.stdout
    assert "s3cret-account-value" not in result.stdout + result.stderr

    # doc-2 takes every job type: fix's workspace needs git.
    second_token = token_file(tmp_path, other)
    second = run_herder("doctor", "--agent", "--server", fleet.url, "--host", "doc-2",
                        "--token-file", str(second_token), "--unit",
                        str(agent_unit(host, fleet.url, "doc-2", second_token)), cwd=host,
                        config=host / "herder.toml")
    found = verdicts(second.stdout)
    assert {"preflight build", "preflight fix", "preflight gone", "git"} <= found.keys()
    assert not any(name.startswith("account ") for name in found)


def test_the_servers_commands_run_only_as_the_agents_user(make_fleet, tmp_path: Path,
                                                          sqlite_url: str) -> None:
    """A preflight and a probe the server chooses each touch a marker file. Run as another
    user than the unit's User= (or as root with no unit), the doctor runs neither and says
    so in one warning per group; as the unit's user (root too, when it says User=root), both
    run."""
    preflight_marker, probe_marker = tmp_path / "preflight-ran", tmp_path / "probe-ran"
    fleet = make_fleet(tmp_path, sqlite_url, extra=(
        '[job_types.mark]\ncommand = ["sh", "-c", "true"]\n'
        f'preflight = ["touch", "{preflight_marker}"]\n'))
    token = fleet.add_host("doc-1", "--ram", "8")
    run_herder("account", "add", "doc-1", "marked", "--probe", f"touch {probe_marker}",
               cwd=fleet.root, db=fleet.db, config=fleet.config, check=True)
    fleet.start_server()
    host = tmp_path / "host"
    host.mkdir()
    (host / "herder.toml").write_text("")
    path = token_file(host, token)

    def doctor_with(unit: Path):
        return run_herder("doctor", "--agent", "--server", fleet.url, "--host", "doc-1",
                          "--token-file", str(path), "--unit", str(unit), cwd=host,
                          config=host / "herder.toml")

    someone_else = "nobody" if ME != "nobody" else "root"
    refused = [doctor_with(agent_unit(host, fleet.url, "doc-1", path, someone_else))]
    if os.geteuid() == 0:
        refused.append(doctor_with(host / "no-such.service"))
    for result in refused:
        assert not preflight_marker.exists() and not probe_marker.exists(), result.stdout
        found = verdicts(result.stdout)
        assert found["preflights"] == found["accounts"] == "warning", result.stdout
        assert "preflight mark" not in found and "account marked" not in found
        assert "warning  preflights: skipped (1 preflight(s) from the server): " \
            in result.stdout
        assert "warning  accounts: skipped (1 probe(s) from the server): " in result.stdout
    assert f"this doctor runs as {ME}, the agent as {someone_else}" in refused[0].stdout
    assert (f"(fix: run as the agent's user (e.g. sudo -u {someone_else} herder doctor "
            f"--agent --server {fleet.url} --host doc-1 ...))") in refused[0].stdout

    ran = doctor_with(agent_unit(host, fleet.url, "doc-1", path, ME))
    found = verdicts(ran.stdout)
    assert found["preflight mark"] == "ok" and "account marked" in found, ran.stdout
    assert preflight_marker.exists() and probe_marker.exists()


@pytest.mark.parametrize(("unit", "euid", "runs"), [
    (None, 0, False),  # root, and no unit to say it is the agent's user
    (None, 1000, True),  # no unit: any other user is taken for the agent's
    ("User=root", 0, True),  # root only when the unit says so
    ("User=0", 0, True),
    ("", 0, False),  # no User=: the agent runs as root, but the unit does not say so
    ("", 1000, False),
    ("User=nobody", 0, False),
    ("User=nobody", "nobody", True),
    ("User=root", "nobody", False),
    ("User=no-such-user-herder", 1000, False),
])
def test_who_runs_the_servers_commands(tmp_path: Path, unit: str | None, euid: int | str,
                                       runs: bool) -> None:
    from herder.services.doctor import withheld

    path = tmp_path / "herder-agent.service"
    if unit is not None:
        path.write_text(f"[Unit]\nDescription=herder agent\n[Service]\n{unit}\n"
                        "ExecStart=/usr/bin/herder agent\n")
    uid = pwd.getpwnam(euid).pw_uid if isinstance(euid, str) else euid
    refusal = withheld(str(path), uid, "https://s.example", "doc-1")
    assert (refusal is None) is runs, refusal
    if refusal is not None:
        assert "sudo -u " in refusal.fix and "--host doc-1" in refusal.fix


def test_an_unreachable_server_runs_no_preflight_on_a_guess(tmp_path: Path,
                                                            sqlite_url: str) -> None:
    path = token_file(tmp_path, "hdr_" + "y" * 40)
    result = run_herder("doctor", "--agent", "--server", f"http://127.0.0.1:{free_port()}",
                        "--host", "doc-1", "--token-file", str(path), cwd=tmp_path,
                        db=sqlite_url, config=write_toml(tmp_path, HEALTHY))
    assert result.returncode == 1
    found = verdicts(result.stdout)
    assert found["job types"] == "problem" and "no preflight or probe ran" in result.stdout
    assert not any(name.startswith("preflight ") for name in found)


def write_toml(folder: Path, text: str) -> Path:
    path = folder / "herder.toml"
    path.write_text(text)
    return path


# -- the checks' route, every answer (httpx.MockTransport) -----------------------------------

CHECKS_BODY = {
    "label": "doc-1",
    "job_types": {
        "build": {"preflight": {"argv": ["cc", "--version"], "strict": False, "timeout": 5.0,
                                "cache": 45.0}, "workspace": True},
        "shell": {"preflight": None, "workspace": False},
    },
    "probes": {"one": {"argv": ["probe", "one"], "timeout": 7.0, "interval": 60.0}},
}


def fetched(tmp_path: Path, answer) -> tuple[object, Finding, list[httpx.Request]]:
    """fetch_plan against a server that answers with `answer(request)`."""
    from herder.core.settings.loading import load_config
    from herder.runtime.agent_client import ServerClient
    from herder.services.doctor import fetch_plan

    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answer(request)

    config = load_config(write_toml(tmp_path, HEALTHY + (
        '\n[hosts.doc-1]\nram_total_gb = 8\n'
        '[hosts.doc-1.accounts.local]\nprobe = ["local-probe"]\n')))
    client = ServerClient("http://127.0.0.1:9", "hdr_" + "t" * 40, "doc-1",
                          transport=httpx.MockTransport(handler))
    try:
        plan, finding = fetch_plan(client, config)
    finally:
        client.close()
    return plan, finding, seen


def test_the_servers_checks_are_the_plan(tmp_path: Path) -> None:
    plan, finding, seen = fetched(tmp_path, lambda _: httpx.Response(200, json=CHECKS_BODY))
    assert [request.url.path for request in seen] == ["/api/v1/agent/doc-1/checks"]
    assert seen[0].method == "GET"
    assert seen[0].headers["authorization"] == "Bearer hdr_" + "t" * 40
    assert finding == ok("job types", "from the server: 1 preflight(s), 1 account probe(s) "
                         "for host doc-1")
    assert plan.preflights["build"].argv == ("cc", "--version")
    assert not plan.preflights["build"].strict and "shell" not in plan.preflights
    assert plan.workspaces == ("build",)
    assert plan.probes["one"].argv == ("probe", "one") and plan.probes["one"].timeout == 7.0


def test_an_older_server_falls_back_to_the_local_file_with_a_warning(tmp_path: Path) -> None:
    plan, finding, _ = fetched(tmp_path, lambda _: httpx.Response(
        404, json={"detail": "Not Found"}))
    assert finding.verdict is Verdict.WARNING
    assert "has no /api/v1/agent/doc-1/checks (older than this herder)" in finding.detail
    assert "read from this host's herder.toml" in finding.detail
    assert finding.fix == "upgrade herder on the server"
    assert sorted(plan.preflights) == ["build", "fix"] and plan.workspaces == ("fix",)
    assert sorted(plan.probes) == ["local"]
    # This host's own herder.toml is the operator's: its preflights run as any user.
    from herder.services.doctor import Withheld, check_preflights

    assert not plan.from_server
    found = check_preflights(plan, (), Withheld("as root", "run as the agent's user"))
    assert sorted(finding.name for finding in found) == ["preflight build", "preflight fix"]


@pytest.mark.parametrize(("status", "expected"), [
    (401, "the server refuses this host's token (HTTP 401: no)"),
    (403, "the server refuses this host's token (HTTP 403: no)"),
    (409, "the server answers HTTP 409: no"),
    (500, "the server answers HTTP 500: no"),
    (503, "the server answers HTTP 503: no"),
])
def test_a_refusing_or_failing_server_runs_nothing(tmp_path: Path, status: int,
                                                   expected: str) -> None:
    plan, finding, _ = fetched(tmp_path, lambda _: httpx.Response(status,
                                                                  json={"detail": "no"}))
    assert plan is None and finding.verdict is Verdict.PROBLEM
    assert finding.detail.startswith(expected), finding.detail
    assert "no preflight or probe ran" in finding.detail


def test_a_server_that_times_out_or_answers_nonsense_runs_nothing(tmp_path: Path) -> None:
    def hangs(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    plan, finding, _ = fetched(tmp_path, hangs)
    assert plan is None and finding.verdict is Verdict.PROBLEM
    assert "cannot ask http://127.0.0.1:9 (ReadTimeout: timed out)" in finding.detail
    plan, finding, _ = fetched(tmp_path, lambda _: httpx.Response(200, json={"label": 3}))
    assert plan is None and finding.verdict is Verdict.PROBLEM
    assert "does not parse" in finding.detail
