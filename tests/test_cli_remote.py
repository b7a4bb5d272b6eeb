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
from typing import Any, NamedTuple

import httpx
import pytest
from support.cli import herder_argv, run_herder
from support.environment import clean_environment
from support.waits import wait_for

from herder.core.access import new_token, token_hash
from herder.core.errors import Conflict, InputError, NotFound
from herder.core.host_settings import HostSettings
from herder.core.model import Account, JobStatus, ReservationStatus, Scope
from herder.services.dispatch_check import DispatchCheckFailed
from herder.services.remote import (
    RemoteClient,
    ServerFailed,
    TokenRefused,
    plain_http_warning,
)

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
    with pytest.raises(Conflict) as raised:
        client_answering(409, {"detail": "attempt 7.1 never ran on host a"}).cancel(7)
    assert str(raised.value) == "attempt 7.1 never ran on host a"


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


# The calls of the commands that once needed the database: (call, method, path, JSON body
# sent, 2xx answer, what the call returns).
ADMIN_CALLS: list[tuple[Any, str, str, Any, int, Any, Any]] = [
    (lambda c: c.host_add("lap-2", HostSettings(ram_total_gb=8.0, job_types=frozenset()),
                          enabled=False),
     "POST", "/api/v1/hosts", {"label": "lap-2", "enabled": False, "ram_total_gb": 8.0,
                               "job_types": []},
     201, {"label": "lap-2", "token": "hdr_agent"}, "hdr_agent"),
    (lambda c: c.host_set("lap-2", HostSettings(cpus=4, weights=frozenset({"light"}))),
     "PATCH", "/api/v1/hosts/lap-2", {"cpus": 4, "weights": ["light"]},
     200, {"label": "lap-2"}, None),
    (lambda c: c.host_remove("lap-2"), "DELETE", "/api/v1/hosts/lap-2", None,
     200, {"label": "lap-2"}, None),
    (lambda c: c.host_token("lap-2"), "POST", "/api/v1/hosts/lap-2/token", None,
     200, {"label": "lap-2", "token": "hdr_new"}, "hdr_new"),
    (lambda c: c.account_add(Account("lap-2", "main", {"A": "1"}, 2, frozenset({"t"}),
                                     ("probe", "x"), "cli")),
     "PUT", "/api/v1/accounts/lap-2/main",
     {"env": {"A": "1"}, "max_sessions": 2, "job_types": ["t"], "probe": ["probe", "x"]},
     200, {"host": "lap-2", "name": "main", "changed": True}, None),
    (lambda c: c.account_remove("lap-2", "main"), "DELETE", "/api/v1/accounts/lap-2/main",
     None, 200, {"host": "lap-2", "name": "main", "changed": True}, None),
    (lambda c: c.account_clear("lap-2", "main"), "POST", "/api/v1/accounts/lap-2/main/clear",
     None, 200, {"host": "lap-2", "name": "main", "changed": False}, False),
    (lambda c: c.claim_slot("run-1", "lap-2", "light"), "POST", "/api/v1/slots/claim",
     {"run_id": "run-1", "host": "lap-2", "weight": "light"},
     201, {"id": 5, "run_id": "run-1", "host": "lap-2"}, 5),
    (lambda c: c.release_slot("run-1"), "POST", "/api/v1/slots/release", {"run_id": "run-1"},
     200, {"released": True}, True),
    (lambda c: c.reserve("job-3", "lap-2", "subagent", 2), "POST", "/api/v1/reservations",
     {"owner": "job-3", "host": "lap-2", "weight": "subagent", "count": 2},
     201, {"reserved": [8], "requested": 2}, [8]),
    (lambda c: c.reserve("job-3", "lap-2", "subagent", 2, job=3), "POST",
     "/api/v1/reservations",
     {"owner": "job-3", "host": "lap-2", "weight": "subagent", "count": 2, "job": 3},
     201, {"reserved": [8, 9], "requested": 2}, [8, 9]),
    (lambda c: c.complete_reservation(8, ReservationStatus.DONE), "POST",
     "/api/v1/reservations/8/complete", {"status": "done"},
     200, {"id": 8, "status": "done"}, ReservationStatus.DONE),
    (lambda c: c.should_dispatch("repo#1"), "GET", "/api/v1/jobs/dedup-holder", None,
     200, {"key": "repo#1", "job_id": 4, "status": "running"}, (4, JobStatus.RUNNING)),
    (lambda c: c.dispatch_check("issue", "repo#1", {"state": "$(id)"}), "POST",
     "/api/v1/jobs/dispatch-check",
     {"job_type": "issue", "dedup_key": "repo#1", "payload": {"state": "$(id)"}},
     200, {"skip": True, "reason": "PR #3 closes it"}, "PR #3 closes it"),
]
CALL_IDS = [f"{method} {path}" for _c, method, path, *_rest in ADMIN_CALLS]


@pytest.mark.parametrize(("call", "method", "path", "sent", "status", "answer", "returned"),
                         ADMIN_CALLS, ids=CALL_IDS)
def test_each_call_sends_its_request_and_reads_the_answer(call, method, path, sent, status,
                                                         answer, returned):
    seen: list[httpx.Request] = []
    assert call(client_answering(status, answer, seen)) == returned
    assert (seen[0].method, seen[0].url.path) == (method, path)
    assert (json.loads(seen[0].content) if seen[0].content else None) == sent


def test_a_free_dedup_key_is_none_and_the_key_is_a_query_parameter():
    seen: list[httpx.Request] = []
    assert client_answering(200, {"key": "a/b?c"}, seen).should_dispatch("a/b?c") is None
    assert seen[0].url.params["key"] == "a/b?c"


def test_a_dispatch_check_that_dispatches_is_none_and_one_that_failed_is_an_error():
    assert client_answering(200, {"skip": False}).dispatch_check("issue", "k", {}) is None
    with pytest.raises(DispatchCheckFailed, match="exit 3: gh: HTTP 502"):
        client_answering(200, {"error": "job_types.issue.dispatch_check: exit 3: gh: HTTP 502"}
                         ).dispatch_check("issue", "k", {})


@pytest.mark.parametrize(("status", "body", "error", "message"), [
    (403, {"detail": "this route needs a admin token; this one is submit"}, TokenRefused,
     "needs a admin token"),
    (404, {"detail": "no host 'lap-2' (see `herder hosts`)"}, NotFound, "no host 'lap-2'"),
    (409, {"detail": "host 'lap-2' still has claimed or running jobs; drain it first"},
     Conflict, "drain it first"),
    (422, {"error": "--weights: unknown weight 'x' (use one of: light)", "field": "--weights"},
     InputError, "--weights: unknown weight 'x'"),
    (500, {"detail": "Internal Server Error"}, ServerFailed, "HTTP 500"),
    (503, {"detail": "the database is unavailable; retry later"}, ServerFailed, "HTTP 503"),
])
@pytest.mark.parametrize("call", [entry[0] for entry in ADMIN_CALLS], ids=CALL_IDS)
def test_each_call_turns_a_refusal_or_failure_into_one_error(call, status, body, error,
                                                             message):
    with pytest.raises(error) as raised:
        call(client_answering(status, body))
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert "hdr_secret" not in str(raised.value)


@pytest.mark.parametrize("call", [entry[0] for entry in ADMIN_CALLS], ids=CALL_IDS)
def test_each_call_turns_a_timeout_into_one_line(call):
    with pytest.raises(ServerFailed, match="did not answer within"):
        call(client_answering(200, {}, error=httpx.ReadTimeout("timed out")))


def test_a_label_no_host_can_have_never_reaches_another_route():
    seen: list[httpx.Request] = []
    client = client_answering(200, {}, seen)
    with pytest.raises(NotFound, match=r"no host '\.\./jobs'"):
        client.host_remove("../jobs")
    with pytest.raises(NotFound, match="no account"):
        client.account_clear("lap-1", "a/b")
    with pytest.raises(InputError, match="NAME: 'a b' is not a valid account name"):
        client.account_add(Account("lap-1", "a b"))
    assert seen == []


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


def token_file(folder: Path, fleet: Any, scope: Scope, allow_adhoc: bool = False) -> Path:
    return Path(fleet.token_file(folder, scope, allow_adhoc))


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
    assert operator.ok("why", str(held)).startswith("not before")
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
    assert "database only" in operator.error("token", "list")
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


def same_but(server_out: str, database_out: str, *pairs: tuple[str, str]) -> None:
    """The server's output is the database's, once the database side's names are swapped
    for the server side's (two hosts or accounts changed the same way)."""
    for server_name, database_name in pairs:
        database_out = database_out.replace(database_name, server_name)
    assert server_out == database_out


class Sides(NamedTuple):
    """A fleet with lap-1 and a server, and two operators over it: an admin and a CI runner
    whose submit token may run ad-hoc commands (since issue 23 only --allow-adhoc may)."""

    fleet: Any
    admin: Operator
    ci: Operator


@pytest.fixture
def sides(make_fleet, tmp_path, store_url) -> Sides:
    fleet = make_fleet(tmp_path, store_url)
    fleet.add_host("lap-1", "--ram", "16")
    fleet.start_server()
    admin = Operator(tmp_path / "operator", fleet.url, token_file(tmp_path, fleet, Scope.ADMIN))
    ci = Operator(tmp_path / "ci", fleet.url,
                  token_file(tmp_path, fleet, Scope.SUBMIT, allow_adhoc=True))
    return Sides(fleet, admin, ci)


def test_host_add_set_token_and_remove_work_over_the_server(sides):
    fleet, admin = sides.fleet, sides.admin
    # host add: the token on stdout once, the same lines as against the database
    options = ("--ram", "16", "--reserved", "1", "--cpus", "4", "--job-types", "adhoc",
               "--weights", "light,heavy", "--night-workers", "3", "--label", "gpu")
    over = admin.run("host", "add", "lap-2", *options)
    local = fleet.cli("host", "add", "lap-3", *options)
    assert over.returncode == local.returncode == 0, over.stderr
    token, local_token = over.stdout.strip(), local.stdout.strip()
    assert token.startswith("hdr_") and over.stdout == token + "\n"
    same_but(over.stderr, local.stderr, ("lap-2", "lap-3"), (token, local_token))
    record = fleet.store.token_get(token_hash(token))
    assert record is not None and (record.scope, record.host) == (Scope.AGENT, "lap-2")
    assert token not in fleet.cli("hosts", "--json").stdout  # never shown again

    # host set and the views of the two hosts: the same but for the label
    for server_args, local_args in [
            (("host", "set", "lap-2", "--prime-max-weight", "light", "--priority-floor", "5"),
             ("host", "set", "lap-3", "--prime-max-weight", "light", "--priority-floor", "5")),
            (("host", "set", "lap-2", "--job-types", ""), ("host", "set", "lap-3",
                                                           "--job-types", ""))]:
        same_but(admin.ok(*server_args), fleet.cli(*local_args).stdout, ("lap-2", "lap-3"))
    views = {view["label"]: view for view in json.loads(admin.ok("hosts", "--json"))}
    assert {**views["lap-3"], "label": "lap-2"} == views["lap-2"]
    assert views["lap-2"]["allowed_job_types"] is None
    assert views["lap-2"]["allowed_weights"] == ["heavy", "light"]
    assert views["lap-2"]["priority_floor"] == 5
    for args in (("ram", "lap-2"), ("hosts", "--json")):
        assert admin.ok(*args) == fleet.cli(*args).stdout, args

    # host token: a new one, the old one refused from now on
    new_token_ = admin.ok("host", "token", "lap-2").strip()
    assert new_token_.startswith("hdr_") and new_token_ != token
    old = fleet.store.token_get(token_hash(token))
    assert old is not None and old.revoked_at is not None

    # refusals read the same whichever way they went
    for args in (("host", "set", "nope", "--cpus", "2"), ("host", "add", "lap-2", "--ram", "8"),
                 ("host", "add", "bad label", "--ram", "8"), ("host", "add", "lap-9"),
                 ("host", "set", "lap-2", "--weights", "no-such-weight"),
                 ("host", "set", "lap-2", "--transport", "ssh"), ("ram", "nope"),
                 # issue 23: only herder.toml declares a local host, on either path
                 ("host", "set", "lap-2", "--transport", "local"),
                 ("host", "add", "lap-9", "--ram", "8", "--transport", "local"),
                 ("host", "token", "nope"), ("host", "remove", "nope"),
                 # a host that could never take a job (feasibility), refused on both paths
                 ("host", "add", "lap-9", "--ram", "8", "--reserved", "8"),
                 ("host", "set", "lap-2", "--job-types", "no-such-type")):
        line = admin.error(*args)
        assert fleet.cli(*args, check=False).stderr == line + "\n", args
    assert fleet.store.host_get("lap-9") is None

    same_but(admin.ok("host", "remove", "lap-2"), fleet.cli("host", "remove", "lap-3").stdout,
             ("lap-2", "lap-3"))
    assert fleet.store.host_get("lap-2") is None
    revoked = fleet.store.token_get(token_hash(new_token_))
    assert revoked is not None and revoked.revoked_at is not None



def test_account_commands_work_over_the_server(sides):
    fleet, admin = sides.fleet, sides.admin
    # accounts: add, clear, remove; the table drawn the same, never an env value
    over_saved = admin.ok("account", "add", "lap-1", "acct-a", "--env", "SECRET_DIR=/s/a",
                          "--max-sessions", "2", "--probe", "true")
    local_saved = fleet.cli("account", "add", "lap-1", "acct-b", "--env", "SECRET_DIR=/s/a",
                            "--max-sessions", "2", "--probe", "true").stdout
    same_but(over_saved, local_saved, ("acct-a", "acct-b"))
    assert fleet.store.account_env("lap-1", "acct-a") == {"SECRET_DIR": "/s/a"}
    for args in (("accounts",), ("accounts", "--json"), ("accounts", "--host", "lap-1")):
        assert admin.ok(*args) == fleet.cli(*args).stdout, args
    assert "/s/a" not in admin.ok("accounts", "--json")
    table = admin.ok("accounts").splitlines()
    assert table[0].split() == ["HOST", "ACCOUNT", "STATE", "SESSIONS", "JOB", "TYPES",
                                "SOURCE"]
    assert table[1].split()[:2] == ["lap-1", "acct-a"] and "0/2" in table[1]
    same_but(admin.ok("account", "clear", "lap-1", "acct-a"),
             fleet.cli("account", "clear", "lap-1", "acct-b").stdout, ("acct-a", "acct-b"))
    for args in (("account", "add", "lap-1", "x", "--job-type", "no-such-type"),
                 ("account", "add", "lap-1", "x", "--env", "1BAD=v"),
                 ("account", "add", "lap-1", "x", "--max-sessions", "0"),
                 ("account", "add", "lap-1", "bad name"),
                 ("account", "clear", "lap-1", "nope"), ("account", "remove", "lap-1", "nope")):
        line = admin.error(*args)
        assert fleet.cli(*args, check=False).stderr == line + "\n", args
    same_but(admin.ok("account", "remove", "lap-1", "acct-a"),
             fleet.cli("account", "remove", "lap-1", "acct-b").stdout, ("acct-a", "acct-b"))
    assert fleet.store.account_list("lap-1") == []


def test_slots_reservations_and_should_dispatch_work_over_the_server(sides):
    fleet, admin, ci = sides
    # CI slots and subagent reservations with a submit token (a CI runner's)
    slot = ci.ok("slots", "claim", "run-1", "--host", "lap-1", "--weight", "heavy")
    assert slot.strip().isdigit()
    assert ci.ok("slots", "claim", "run-1", "--host", "lap-1", "--weight", "heavy") == slot
    assert fleet.cli("slots", "claim", "run-1", "--host", "lap-1", "--weight",
                     "heavy").stdout == slot
    assert admin.ok("ram", "lap-1") == fleet.cli("ram", "lap-1").stdout
    assert ci.ok("slots", "release", "run-1") == "released\n"
    assert ci.ok("slots", "release", "run-1") == fleet.cli("slots", "release",
                                                           "run-1").stdout
    assert fleet.cli("slots", "release", "run-1").stdout == "nothing to release\n"
    for args in (("slots", "claim", "run-2", "--host", "nope", "--weight", "heavy"),
                 ("slots", "claim", "run-2", "--host", "lap-1", "--weight", "huge"),
                 ("reserve", "job-1", "--host", "nope", "--count", "1"),
                 ("complete", "999999", "--status", "done")):
        line = ci.error(*args)
        assert fleet.cli(*args, check=False).stderr == line + "\n", args
    reserved = ci.run("reserve", "job-1", "--host", "lap-1", "--count", "2")
    assert reserved.returncode == 0 and reserved.stderr == "", reserved.stderr
    first, second = reserved.stdout.split()
    done_first = ci.ok("complete", first, "--status", "done")
    assert done_first == f"reservation {first}: done\n"
    same_but(done_first, fleet.cli("complete", second, "--status", "done").stdout,
             (first, second))
    # ended once: completing again says how it ended, whichever way it is asked
    assert fleet.cli("complete", first, "--status", "failed").stdout == done_first
    assert ci.ok("complete", first, "--status", "failed") == done_first
    assert "token refused" in ci.error("host", "remove", "lap-3")  # admin only

    # should-dispatch: exit 0 (free) or 10 (held), the same line both ways
    held = int(ci.ok("submit", "--dedup-key", "repo#7", "--delay", "1h", "--", "true"))
    for key, code in (("repo#7", 10), ("repo#8", 0)):
        over = ci.run("should-dispatch", key)
        local = fleet.cli("should-dispatch", key, check=False)
        assert over.returncode == local.returncode == code, (over.stdout, over.stderr)
        assert over.stdout == local.stdout, key
    assert ci.ok("should-dispatch", "repo#8") == "dispatch: no job holds 'repo#8'\n"
    assert ci.run("should-dispatch", "repo#7").stdout == (
        f"skip: job {held} is queued with dedup key 'repo#7'\n")


def test_a_host_with_a_running_job_is_not_removed_either_way(sides, tmp_path):
    fleet, admin, ci = sides
    # host remove: refused while a job runs there (the same line both ways), then done
    fleet.start_agent("lap-1")
    gate = tmp_path / "gate"
    running = int(ci.ok("submit", "--host", "lap-1", "--", "sh", "-c",
                        f"while [ ! -e '{gate}' ]; do sleep 0.05; done"))
    fleet.wait_status(running, JobStatus.RUNNING, 60)
    line = admin.error("host", "remove", "lap-1")
    assert "drain it first" in line
    assert fleet.cli("host", "remove", "lap-1", check=False).stderr == line + "\n"
    assert fleet.store.host_get("lap-1") is not None
    gate.touch()
    fleet.wait_status(running, JobStatus.DONE, 60)


def test_token_commands_need_the_database_even_with_a_server(sides):
    admin = sides.admin
    # tokens come from the database only: one line, exit 2, naming it
    line = admin.error("token", "create", "--scope", "read")
    assert "--db / HERDER_DB" in line and "first admin token" in line
    assert admin.error("token", "list") == line
