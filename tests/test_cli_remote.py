"""The CLI against a server: `herder --server URL ...` with an operator token and no database
variables, the same output as against the database, and every answer of the server turned
into a result or one line on stderr."""

from __future__ import annotations

import json
import os
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.cli import herder_argv, run_herder
from support.environment import clean_environment
from support.waits import wait_for

from herder.api.tokens import new_token
from herder.errors import InputError, NotFound
from herder.model import JobStatus, Scope
from herder.remote import RemoteClient, ServerFailed, TokenRefused, plain_http_warning

# -- the client's answers to each kind of reply (httpx.MockTransport) ---------------------------

JOB = {"id": 7, "status": "queued", "job_type": "adhoc", "priority": 100, "weight": "light",
       "attempt": 0, "max_attempts": 3, "failures": 0, "lost": 0, "host": None,
       "exit_code": None, "failure_reason": None, "dedup_key": None, "affinity": None,
       "command": ["true"], "payload": {}, "workdir": None, "timeout_seconds": None,
       "cancel_requested": False, "available_at": "2026-01-01T00:00:00+00:00",
       "created_at": "2026-01-01T00:00:00+00:00", "claimed_at": None, "started_at": None,
       "finished_at": None, "updated_at": "2026-01-01T00:00:00+00:00"}


def client_answering(status: int, body: Any = None, seen: list[httpx.Request] | None = None,
                     error: Exception | None = None) -> RemoteClient:
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        if error is not None:
            raise error
        if isinstance(body, bytes):
            return httpx.Response(status, content=body)
        return httpx.Response(status, json=body)

    return RemoteClient("http://herder.test", "hdr_secret", transport=httpx.MockTransport(handler))


def test_a_2xx_answer_is_the_job_and_the_token_is_sent_as_a_bearer():
    seen: list[httpx.Request] = []
    job = client_answering(200, JOB, seen).get(7)
    assert (job.id, job.status, job.command) == (7, JobStatus.QUEUED, ("true",))
    assert seen[0].url.path == "/api/v1/jobs/7"
    assert seen[0].headers["Authorization"] == "Bearer hdr_secret"


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_token_says_so_and_never_shows_the_token(status):
    with pytest.raises(TokenRefused) as raised:
        client_answering(status, {"detail": "unknown token"}).get(7)
    assert "token refused" in str(raised.value) and "unknown token" in str(raised.value)
    assert "hdr_secret" not in str(raised.value)


def test_404_is_the_servers_not_found():
    with pytest.raises(NotFound, match=r"^no job 7$"):
        client_answering(404, {"detail": "no job 7"}).get(7)


def test_422_names_the_field_the_server_named():
    with pytest.raises(InputError) as raised:
        client_answering(422, {"error": "job_type: unknown job type 'x' (use one of [])",
                               "field": "job_type"}).submit("x")
    assert raised.value.field == "job_type"
    assert str(raised.value) == "job_type: unknown job type 'x' (use one of [])"


def test_422_from_the_body_model_names_where_the_problem_is():
    body = {"detail": [{"loc": ["body", "priority"], "msg": "Input should be an integer"}]}
    with pytest.raises(InputError, match=r"priority: Input should be an integer"):
        client_answering(422, body).submit(command=["true"])


def test_409_is_the_servers_words():
    with pytest.raises(InputError, match=r"attempt 7\.1 never ran"):
        client_answering(409, {"detail": "attempt 7.1 never ran on host a"}).cancel(7)


@pytest.mark.parametrize("status", [500, 502, 503])
def test_5xx_is_one_line_naming_the_status(status):
    with pytest.raises(ServerFailed, match=f"failed \\(HTTP {status}\\): the database"):
        client_answering(status, {"detail": "the database is unavailable; retry later"}).list()


def test_an_answer_that_is_not_json_is_a_failure_not_a_traceback():
    with pytest.raises(ServerFailed, match="no JSON"):
        client_answering(200, b"<html>a proxy</html>").list()


@pytest.mark.parametrize("error", [httpx.ConnectError("Connection refused"),
                                   httpx.ReadTimeout("timed out")])
def test_a_timeout_or_a_refused_connection_is_one_line(error):
    with pytest.raises(ServerFailed) as raised:
        client_answering(200, JOB, error=error).get(7)
    assert "herder.test" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_log_that_does_not_exist_yet_is_none_but_an_unknown_job_is_not_found():
    assert client_answering(404, {"detail": "the log of job 7 attempt 1 does not exist "
                                            "(yet)"}).log(7, 1, 0) is None
    with pytest.raises(NotFound):
        client_answering(404, {"detail": "no job 7"}).log(7, 1, 0)
    assert client_answering(200, b"hello\n").log(7, 1, 0) == b"hello\n"


def test_submit_sends_only_what_was_given():
    seen: list[httpx.Request] = []
    client_answering(201, {"id": 3, "created": True, "status": "queued"}, seen).submit(
        command=["make", "test"], priority=5, workdir="/srv/repo", check_command=True)
    assert json.loads(seen[0].content) == {"command": ["make", "test"], "priority": 5,
                                           "workdir": "/srv/repo", "force": False}


def test_plain_http_is_warned_about_only_off_loopback():
    assert plain_http_warning("http://127.0.0.1:8470") is None
    assert plain_http_warning("http://localhost:8470") is None
    assert plain_http_warning("https://queue.example:8470") is None
    assert "unencrypted" in (plain_http_warning("http://queue.example:8470") or "")


# -- a real server, the CLI as a subprocess ------------------------------------------------------


def without_age(table: str) -> list[list[str]]:
    """`herder jobs` as cells, without the AGE column (a second may tick between two runs)."""
    rows = [re.split(r"\s{2,}", line) for line in table.splitlines()]
    return [row[:7] + row[8:] for row in rows]


def token_file(folder: Path, fleet: Any, scope: Scope) -> Path:
    return Path(fleet.token_file(folder, scope))


class Operator:
    """`herder` on a machine with no database credentials: only the server and a token."""

    def __init__(self, folder: Path, server: str, token: Path) -> None:
        folder.mkdir(exist_ok=True)
        self.folder = folder
        self.env = {"HERDER_SERVER": server, "HERDER_TOKEN_FILE": str(token)}

    def run(self, *args: str, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        return run_herder(*args, cwd=self.folder, env={**self.env, **(env or {})})

    def ok(self, *args: str, env: dict[str, str] | None = None) -> str:
        result = self.run(*args, env=env)
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        return result.stdout

    def error(self, *args: str, env: dict[str, str] | None = None, code: int = 2) -> str:
        """Exit `code`, one `herder: error:` line on stderr."""
        result = self.run(*args, env=env)
        assert result.returncode == code, (args, result.returncode, result.stdout,
                                           result.stderr)
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("herder: error: "), result.stderr
        return lines[0]


def test_every_operator_command_works_over_the_server_as_against_the_database(
        make_fleet, tmp_path, store_url):
    fleet = make_fleet(tmp_path, store_url)
    fleet.add_host("lap-1", "--ram", "16")
    fleet.start_server()
    fleet.start_agent("lap-1")
    operator = Operator(tmp_path / "operator", fleet.url, token_file(tmp_path, fleet, Scope.ADMIN))
    gate = tmp_path / "gate"

    # submit: nothing is checked on this machine; the server validates, the host runs it
    out = operator.ok("submit", "--", "sh", "-c",
                      f"echo first; while [ ! -e '{gate}' ]; do sleep 0.05; done; echo second")
    job_id = int(out.strip())
    fleet.wait_status(job_id, JobStatus.RUNNING, 60)

    # logs -f follows the running attempt through the log endpoint until it ends
    follow_out = tmp_path / "follow.out"
    with open(follow_out, "wb") as sink:
        follower = subprocess.Popen(
            herder_argv("logs", "-f", str(job_id)), cwd=operator.folder, stdout=sink,
            stderr=subprocess.PIPE, env=clean_environment(operator.env))
    try:
        wait_for(lambda: b"first\n" in follow_out.read_bytes(), 60,
                 "logs -f to print the running job's first line", fleet.describe)
        assert follower.poll() is None  # still following: the job waits at the gate
        gate.touch()
        assert fleet.wait_exit(follower, 60, "logs -f after the job ended") == 0
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    followed = follow_out.read_bytes()
    assert b"first\nsecond\n" in followed, followed
    fleet.wait_status(job_id, JobStatus.DONE, 60)
    log = operator.ok("logs", str(job_id))
    assert log.encode().startswith(followed) and log == fleet.cli("logs", str(job_id)).stdout

    # reads: the same output as the same command against the database
    assert without_age(operator.ok("jobs")) == without_age(fleet.cli("jobs").stdout)
    for args in (("jobs", "--json"), ("show", str(job_id)),
                 ("show", str(job_id), "--json"), ("why", str(job_id))):
        assert operator.ok(*args) == fleet.cli(*args).stdout, args
    assert operator.ok("why", str(job_id)).startswith("done")

    # a program that does not exist here: accepted, its host's launch decides
    held = int(operator.ok("submit", "--host", "lap-1", "--delay", "1h", "--workdir",
                           "/no/such/dir/here", "--", "no-such-program-here").strip())
    assert fleet.job(held).workdir == "/no/such/dir/here"
    assert operator.ok("why", str(held)).startswith("waiting")
    assert "only done, failed or cancelled" in operator.error("retry", str(held))
    assert operator.ok("cancel", str(held)) == f"job {held}: cancelled\n"
    assert operator.ok("retry", str(held)) == f"job {held}: queued\n"
    failed = fleet.wait_status(held, JobStatus.FAILED, 60)  # lap-1 could not run it
    assert failed.host == "lap-1" and failed.attempt >= 1
    assert operator.ok("why", str(held)) == fleet.why(held) + "\n"

    # hosts, host drain / enable
    hosts = {view["label"]: view for view in json.loads(operator.ok("hosts", "--json"))}
    assert hosts["lap-1"]["enabled"] and hosts["lap-1"]["transport"] == "agent"
    assert "lap-1" in operator.ok("hosts")
    assert operator.ok("host", "drain", "lap-1").startswith("host lap-1: drained")
    assert fleet.store.host_get("lap-1").enabled is False  # type: ignore[union-attr]
    assert "drained" in operator.ok("hosts")
    assert operator.ok("host", "enable", "lap-1") == "host lap-1: enabled\n"
    assert fleet.store.host_get("lap-1").enabled is True  # type: ignore[union-attr]
    assert operator.error("host", "drain", "nope") == (
        "herder: error: no host 'nope' (see `herder hosts`)")
    for path in ("/api/v1/hosts/a%00b/drain", "/api/v1/accounts?host=a%00b"):
        method = "POST" if path.endswith("drain") else "GET"
        assert fleet.api(method, path).status_code == 422, path  # not a label: not stored

    # accounts (never an env value) and alerts
    fleet.cli("account", "add", "lap-1", "main", "--env", "CLAUDE_CONFIG_DIR=/secret/dir")
    assert operator.ok("accounts", "--json") == fleet.cli("accounts", "--json").stdout
    assert "main" in operator.ok("accounts") and "/secret/dir" not in operator.ok("accounts")
    fleet.store.alert_open("test:needs-human", "job 1 needs a human", datetime.now(UTC))
    assert "job 1 needs a human" in operator.ok("alerts")
    mine = [alert for alert in json.loads(fleet.cli("alerts", "--json").stdout)
            if alert["key"] == "test:needs-human"]
    assert len(mine) == 1 and mine[0] in json.loads(operator.ok("alerts", "--json"))

    # refusals: one line, exit 2
    assert operator.error("show", "999999") == "herder: error: no job 999999"
    assert "job_type" in operator.error("submit", "no-such-type")
    assert "database only" in operator.error("host", "add", "lap-2", "--ram", "8")
    assert not (operator.folder / "herder.db").exists()  # no store made on this machine

    wrong = tmp_path / "wrong-token"
    wrong.write_text(new_token())
    wrong.chmod(0o600)
    assert "token refused" in operator.error("jobs", env={"HERDER_TOKEN_FILE": str(wrong)})
    reader = token_file(tmp_path, fleet, Scope.READ)
    assert "token refused" in operator.error("cancel", str(job_id),
                                             env={"HERDER_TOKEN_FILE": str(reader)})
    assert operator.ok("jobs", "--json") == fleet.cli("jobs", "--json").stdout

    fleet.stop_server()
    line = operator.error("jobs")
    assert "cannot reach" in line and fleet.url in line


def test_the_token_may_come_from_the_variable_and_a_loose_file_is_refused(
        make_fleet, tmp_path, sqlite_url):
    fleet = make_fleet(tmp_path, sqlite_url)
    fleet.start_server()
    path = token_file(tmp_path, fleet, Scope.READ)
    operator = Operator(tmp_path / "operator", fleet.url, path)
    assert operator.ok("jobs", env={"HERDER_TOKEN_FILE": "",
                                    "HERDER_TOKEN": path.read_text().strip()}).startswith("ID")
    assert "no token" in operator.error("jobs", env={"HERDER_TOKEN_FILE": ""})
    path.chmod(0o644)
    assert "open to group or others" in operator.error("jobs")
    assert "scheme" in operator.error("jobs", env={"HERDER_SERVER": "ftp://queue:8470"})


def test_a_read_that_creates_a_new_sqlite_file_says_so(tmp_path):
    target = tmp_path / "typo.db"
    env = {"HERDER_DB": f"sqlite:///{target}"}
    first = run_herder("jobs", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    assert f"note: {target} did not exist; created an empty store" in first.stderr
    assert target.exists()
    again = run_herder("jobs", cwd=tmp_path, env=env)
    assert again.returncode == 0 and again.stderr == ""
    other = tmp_path / "other.db"
    submitted = run_herder("submit", "--", "true", cwd=tmp_path,
                           env={"HERDER_DB": f"sqlite:///{other}"})
    assert submitted.returncode == 0 and submitted.stderr == ""  # a write means to create it
    assert os.path.exists(other)


def test_a_submit_to_a_database_with_fleet_hosts_leaves_the_command_check_to_the_host(
        tmp_path, sqlite_url):
    env = {"HERDER_DB": sqlite_url}
    missing = ("submit", "--", "no-such-program-for-herder-tests")
    refused = run_herder(*missing, cwd=tmp_path, env=env)
    assert refused.returncode == 2 and "was not found on PATH" in refused.stderr
    assert run_herder("host", "add", "far-1", "--ram", "8", cwd=tmp_path,
                      env=env).returncode == 0  # an agent host: jobs may run there
    accepted = run_herder(*missing, cwd=tmp_path, env=env)
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout.strip().isdigit()
