"""The `herder` command, run as a real subprocess on both backends.

Bad input must exit 2 with one `herder: error:` line naming the field or flag, and leave the
store exactly as it was; reading commands print machine-readable JSON; exit codes are the API.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from support.cli import (
    UNREACHABLE_DB,
    as_json,
    end_job,
    error_line,
    get_job,
    ok,
    run_herder,
    run_many,
    store_state,
    submitted_id,
)

from herder.cli import main
from herder.cli.root import columns
from herder.client import Client
from herder.core.model import JobStatus, Outcome
from herder.core.settings.loading import sample_config
from herder.store import open_store

CONFIG = """
[defaults]
priority = 100
max_attempts = 3

[job_types.greet]
command = ["echo", "hello {name}"]
env = { TIMES = "{times}" }
weight = "heavy"
priority = 5

[job_types.tests]
command = ["echo", "{path}"]

[job_types.based]
command = ["echo"]
workdir = "{repo}"
workdir_base = "/tmp"
"""

JOB_KEYS = {
    "id", "status", "job_type", "priority", "weight", "attempt", "max_attempts", "host",
    "exit_code", "failure_reason", "dedup_key", "created_at", "started_at", "finished_at",
}
COMMANDS = ["init", "migrate", "submit", "jobs", "show", "logs", "cancel", "retry",
            "should-dispatch", "up"]


class Cli:
    """`herder --db URL ...` in a project directory with a herder.toml."""

    def __init__(self, directory: Path, db: str) -> None:
        self.dir = directory
        self.db = db

    def __call__(self, *args: str, env: dict[str, str] | None = None):
        return run_herder(*args, cwd=self.dir, db=self.db, env=env)

    def submit(self, *args: str) -> int:
        """Submit through the command itself."""
        return submitted_id(self("submit", *args))

    def add(self, job_type: str | None = None, command: tuple[str, ...] = ("true",),
            **fields) -> int:
        """Set-up: submit through the Python API (much faster than a subprocess)."""
        with Client(self.db, self.dir / "herder.toml") as client:
            result = client.submit(job_type, None if job_type else list(command),
                                   workdir=str(self.dir), **fields)
        assert result.created
        return result.job_id


@pytest.fixture
def project(tmp_path) -> Path:
    (tmp_path / "herder.toml").write_text(CONFIG)
    return tmp_path


@pytest.fixture
def cli(project, store_url) -> Cli:
    return Cli(project, store_url)


# -- init -------------------------------------------------------------------------------------


def test_init_writes_the_sample_and_refuses_to_overwrite_without_force(tmp_path):
    result = ok(run_herder("init", cwd=tmp_path))
    target = tmp_path / "herder.toml"
    assert target.read_text() == sample_config()
    assert "herder.toml" in result.stdout

    target.write_text("# mine\n")
    line = error_line(run_herder("init", cwd=tmp_path))
    assert "already exists" in line and "--force" in line
    assert target.read_text() == "# mine\n"

    ok(run_herder("init", "--force", cwd=tmp_path))
    assert target.read_text() == sample_config()


def test_init_into_a_new_directory(tmp_path):
    ok(run_herder("init", "team/conf", cwd=tmp_path))
    assert (tmp_path / "team" / "conf" / "herder.toml").read_text() == sample_config()


# -- submit -----------------------------------------------------------------------------------


def test_submit_adhoc_prints_only_the_id_and_passes_argv_through(cli):
    first = cli.submit("--", "true")
    second = cli.submit("--priority", "5", "--max-attempts", "2", "--timeout", "90s",
                        "--", "printf", "%s\n", "--weight", "-p", "x=1", "--")
    assert second == first + 1
    job = get_job(cli.db, second)
    assert job.command == ("printf", "%s\n", "--weight", "-p", "x=1", "--")
    assert (job.job_type, job.priority, job.max_attempts, job.timeout_seconds) == (
        "adhoc", 5, 2, 90.0)
    assert job.weight == "light"
    assert job.status is JobStatus.QUEUED
    assert job.workdir == str(cli.dir.resolve())


def test_submit_job_type_with_params_renders_and_keeps_json_types(cli):
    job_id = cli.submit("greet", "-p", "name=Ada", "-p", "times=3", "-p", "loud=true")
    job = get_job(cli.db, job_id)
    assert job.job_type == "greet"
    assert job.command == ("echo", "hello Ada")
    assert job.env["TIMES"] == "3"
    assert job.payload == {"name": "Ada", "times": 3, "loud": True}
    assert (job.weight, job.priority) == ("heavy", 5)


def test_submit_payload_and_params_merge_params_winning(cli):
    job_id = cli.submit("greet", "--payload", '{"name": "json", "times": 1, "extra": [1]}',
                        "-p", "name=flag")
    assert get_job(cli.db, job_id).payload == {"name": "flag", "times": 1, "extra": [1]}


def test_submit_delay_sets_available_at_in_the_future(cli):
    job = get_job(cli.db, cli.submit("--delay", "10m", "--", "true"))
    assert 595 <= (job.available_at - job.created_at).total_seconds() <= 605
    # `why` says it was delayed, not that it backs off from a failure it never had
    answer = ok(cli("why", str(job.id))).stdout.strip()
    assert answer.startswith("not before ") and "submitted with a delay" in answer, answer
    assert "backoff" not in answer


# On both backends: the usual mistakes, and a NaN that once reached PostgreSQL and crashed.
BAD_SUBMITS = {
    "unknown job type": (["submit", "nope"], "job_type: unknown job type 'nope'"),
    "unknown weight": (["submit", "--weight", "colossal", "--", "true"],
                       "weight: unknown weight 'colossal'"),
    "malformed payload": (["submit", "greet", "--payload", "{name: x}"], "payload: not valid"),
    "bad timeout": (["submit", "--timeout", "5x", "--", "true"], "--timeout: '5x'"),
    "zero max attempts": (["submit", "--max-attempts", "0", "--", "true"],
                          "--max-attempts: must be at least 1"),
    "missing payload field": (["submit", "greet", "-p", "times=1"],
                              "payload.name: job_types.greet.command needs payload field"),
    "command not on PATH": (["submit", "--", "no-such-program-for-herder-tests"],
                            "command: 'no-such-program-for-herder-tests' was not found"),
    "payload NaN": (["submit", "--payload", '{"x": NaN}', "--", "true"], "payload: "),
}
# More of the same (intake rejects them before the store is written): SQLite only.
MORE_BAD_SUBMITS = {
    "huge priority": (["submit", "--priority", "99999999999", "--", "true"], "priority: "),
    "huge max attempts": (["submit", "--max-attempts", "99999999999", "--", "true"],
                          "max_attempts: "),
    "payload NUL": (["submit", "-p", 'x="a\\u0000b"', "--", "true"], "payload: "),
    "payload value as an option": (["submit", "tests", "-p", "path=--basetemp=/home"],
                                   "payload.path: '--basetemp=/home' starts with '-'"),
    "workdir out of its base": (["submit", "based", "-p", "repo=../etc"],
                                "workdir: must stay inside the workdir_base of job type 'based'"),
    "herder's shell variable": (["submit", "--env", "HERDER_P_X=1", "--", "true"],
                                "env.HERDER_P_X: is set by herder"),
    "payload not an object": (["submit", "greet", "--payload", "[1, 2]"],
                              "payload: must be a JSON object"),
    "bad param": (["submit", "greet", "-p", "name"], "-p: 'name' is not key=value"),
    "nan timeout": (["submit", "--timeout", "nan", "--", "true"], "--timeout: 'nan'"),
    "zero timeout": (["submit", "--timeout", "0s", "--", "true"], "timeout: must be greater"),
    "bad delay": (["submit", "--delay", "soon", "--", "true"], "--delay: 'soon'"),
    "huge delay": (["submit", "--delay", "999999999999h", "--", "true"], "--delay: "),
    "command path missing": (["submit", "--", "./missing.sh"],
                             "command: './missing.sh' is not an executable file"),
    "job type and command": (["submit", "greet", "-p", "name=x", "-p", "times=1", "--", "ls"],
                             "command: a job type already names its command"),
    "nothing to run": (["submit"], "command: nothing to run"),
    "bad env": (["submit", "--env", "NOEQUALS", "--", "true"], "--env: 'NOEQUALS'"),
    # issue 23: the env deny-list holds against the database too, whatever the token
    "denied env": (["submit", "--env", "LD_PRELOAD=/tmp/x.so", "--", "true"],
                   "env.LD_PRELOAD: LD_PRELOAD (matches LD_*) loads or runs code"),
    "denied proxy": (["submit", "--env", "https_proxy=http://evil", "--", "true"],
                     "env.https_proxy: https_proxy (matches *_PROXY) sends"),
    "missing workdir": (["submit", "--workdir", "no-such-dir", "--", "true"], "workdir: "),
    "blank dedup key": (["submit", "--dedup-key", " ", "--", "true"], "dedup_key: is empty"),
}


def check_bad_submits(cli: Cli, cases: dict[str, tuple[list[str], str]]) -> None:
    cli.add(dedup_key="existing")
    before = store_state(cli.db)
    results = run_many([args for args, _ in cases.values()], cwd=cli.dir, db=cli.db)
    problems = []
    for (name, (_, expected)), result in zip(cases.items(), results, strict=True):
        try:
            line = error_line(result)
            assert expected in line, line
        except AssertionError as exc:
            problems.append(f"{name}: {exc}")
    assert not problems, "\n".join(problems)
    assert store_state(cli.db) == before


def test_bad_submit_exits_2_names_the_field_and_changes_nothing(cli):
    check_bad_submits(cli, BAD_SUBMITS)


def test_more_bad_submits_exit_2_and_change_nothing(project, sqlite_url):
    check_bad_submits(Cli(project, sqlite_url), MORE_BAD_SUBMITS)


def test_bad_submit_with_a_non_integer_is_a_usage_error_naming_the_flag(cli):
    before = store_state(cli.db)
    result = cli("submit", "--priority", "high", "--", "true")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Invalid value for '--priority': 'high' is not a valid integer" in result.stderr
    assert "Traceback" not in result.stderr
    assert store_state(cli.db) == before


def test_invalid_config_exits_2_naming_file_line_and_key(project, sqlite_url):
    """The config is read before the store is touched, so one backend is enough."""
    cli = Cli(project, sqlite_url)
    (cli.dir / "herder.toml").write_text(
        '[runtime]\nconcurrency = 2\n\n[job_types.greet]\ncommand = ["echo"]\n'
        'timeout = "30x"\n'
    )
    (cli.dir / "bad.toml").write_text("[runtime]\nconcurrency = \n")
    before = store_state(cli.db)
    submit, dispatch, bad, missing = map(error_line, run_many(
        [["submit", "--", "true"], ["should-dispatch", "k"], ["--config", "bad.toml", "jobs"],
         ["--config", "missing.toml", "jobs"]], cwd=cli.dir, db=cli.db))
    for line in (submit, dispatch):
        assert "herder.toml:6: job_types.greet.timeout: '30x' is not a duration" in line
    assert "bad.toml:2: invalid TOML" in bad
    assert "missing.toml: file not found" in missing
    assert store_state(cli.db) == before


DB_COMMANDS = [["submit", "--", "true"], ["jobs"], ["show", "1"], ["migrate"],
               ["should-dispatch", "k"], ["up", "--exit-when-idle"]]


def test_unreachable_database_exits_2_with_one_line_and_no_password(tmp_path):
    secret_url = "postgresql://u:s3cret@127.0.0.1:1/x"
    # HERDER_DB: a password given as --db is deprecated, with a warning line of its own
    # (tests/test_hostile_jobs.py).
    results = run_many(DB_COMMANDS, cwd=tmp_path, env={"HERDER_DB": secret_url})
    for result in results:
        line = error_line(result)
        assert "s3cret" not in result.stderr + result.stdout
        assert "cannot connect to postgresql://u:***@127.0.0.1:1/x" in line
    for result in run_many([["should-dispatch", "k"], ["submit", "--", "true"]],
                           cwd=tmp_path, db=UNREACHABLE_DB):
        assert "cannot connect to postgresql://postgres@127.0.0.1:1/nope" in error_line(result)


def test_unsupported_and_unopenable_databases_exit_2(tmp_path):
    line = error_line(run_herder("jobs", cwd=tmp_path, env={"HERDER_DB": "mysql://u:s3cret@h/db"}))
    assert "db: unsupported database URL 'mysql'" in line
    assert "s3cret" not in line
    line = error_line(run_herder("jobs", cwd=tmp_path, db=f"sqlite:///{tmp_path}/no/dir/x.db"))
    assert "does not exist" in line


def test_a_database_of_a_newer_herder_exits_2_and_is_left_alone(tmp_path):
    """An older herder must not run on a schema it does not know (from v4 on, its finish
    would write into a view): every command stops at open and names the fix."""
    import sqlite3

    db = f"sqlite:///{tmp_path}/h.db"
    ok(run_herder("submit", "--", "true", cwd=tmp_path, db=db))
    conn = sqlite3.connect(tmp_path / "h.db")
    with conn:
        conn.execute("INSERT INTO herder_schema (version, name, applied_at) "
                     "VALUES (99, 'from_the_future', 0)")
    conn.close()
    for result in run_many(DB_COMMANDS, cwd=tmp_path, db=db):
        line = error_line(result)
        assert "schema v99, newer than this herder knows" in line, line
        assert "upgrade herder" in line
    with open_store(db, migrate=False) as store:
        assert len(store.job_list()) == 1 and store.schema_version() == 99


# -- reading ----------------------------------------------------------------------------------


def test_jobs_json_lists_job_objects_newest_first(cli):
    assert json.loads(ok(cli("jobs", "--json")).stdout) == []
    first = cli.add()
    second = cli.add("greet", payload={"name": "x", "times": 2}, dedup_key="d1")
    listed = as_json(cli("jobs", "--json"))
    assert [job["id"] for job in listed] == [second, first]
    for job in listed:
        assert job.keys() >= JOB_KEYS
    newest = listed[0]
    assert (newest["status"], newest["job_type"], newest["priority"], newest["weight"]) == (
        "queued", "greet", 5, "heavy")
    assert (newest["attempt"], newest["max_attempts"], newest["dedup_key"]) == (0, 3, "d1")
    assert newest["host"] is newest["exit_code"] is newest["finished_at"] is None
    assert newest["created_at"] is not None
    assert [job["id"] for job in as_json(cli("jobs", "--json", "--limit", "1"))] == [second]
    assert as_json(cli("jobs", "--json", "--status", "done", "--status", "running")) == []
    header, *rows = ok(cli("jobs")).stdout.splitlines()  # not a terminal: no bold
    assert header.split() == ["ID", "STATUS", "TYPE", "PRI", "WEIGHT", "ATT", "HOST", "AGE",
                              "COMMAND"]
    assert [row.split()[:3] for row in rows] == [
        [str(job["id"]), job["status"], job["job_type"]] for job in listed]
    at = header.index("COMMAND")  # plain columns: each cell starts under its heading
    assert [row[at:] for row in rows] == [" ".join(job["command"])[:60] for job in listed]


def test_columns_pad_each_cell_to_its_widest_and_style_only_the_header():
    lines = columns(("ID", "COMMAND"), [("7", "echo hi"), ("1234", "true")])
    assert [click.unstyle(line) for line in lines] == ["ID    COMMAND", "7     echo hi",
                                                       "1234  true"]
    assert lines[0] != click.unstyle(lines[0]) and lines[1:] == [
        click.unstyle(line) for line in lines[1:]]
    assert columns(("ID", "STATUS"), []) == [click.style("ID  STATUS", bold=True)]


def test_show_json_has_the_job_its_attempts_and_events(cli):
    job_id = cli.add()
    assert end_job(cli.db, job_id, Outcome.OK, 0) is JobStatus.DONE
    view = as_json(cli("show", str(job_id), "--json"))
    assert JOB_KEYS | {"attempts", "events"} <= view.keys()
    assert (view["id"], view["status"], view["attempt"], view["exit_code"]) == (
        job_id, "done", 1, 0)
    assert view["host"] == "test-host"
    assert view["started_at"] is not None and view["finished_at"] is not None
    assert len(view["attempts"]) == 1
    assert view["attempts"][0]["outcome"] == "ok"
    assert view["attempts"][0]["exit_code"] == 0
    assert view["events"][-1]["to_status"] == "done"
    statuses = [e["to_status"] for e in view["events"] if e["to_status"]]
    assert statuses[0] == "queued"
    out = ok(cli("show", str(job_id))).stdout
    assert "done" in out and "events" in out


def test_show_unknown_job_exits_2(cli):
    before = store_state(cli.db)
    assert "no job 99999" in error_line(cli("show", "99999"))
    assert store_state(cli.db) == before


# -- changing ---------------------------------------------------------------------------------


def test_cancel_queued_then_retry_then_retry_again_is_refused(cli):
    job_id = cli.add()
    result = ok(cli("cancel", str(job_id)))
    assert result.stdout.strip() == f"job {job_id}: cancelled"
    assert get_job(cli.db, job_id).status is JobStatus.CANCELLED

    result = ok(cli("retry", str(job_id)))
    assert result.stdout.strip() == f"job {job_id}: queued"
    assert get_job(cli.db, job_id).status is JobStatus.QUEUED

    before = store_state(cli.db)
    line = error_line(cli("retry", str(job_id)))
    assert f"job {job_id} is queued" in line
    assert store_state(cli.db) == before


def test_cancel_and_retry_of_unknown_jobs_exit_2(cli):
    before = store_state(cli.db)
    for result in run_many([["cancel", "424242"], ["retry", "424242"]], cwd=cli.dir, db=cli.db):
        assert "no job 424242" in error_line(result)
    assert store_state(cli.db) == before


def test_retry_of_a_failed_job_gives_a_fresh_budget(cli):
    job_id = cli.add(command=("false",), max_attempts=1)
    assert end_job(cli.db, job_id, Outcome.FAILED, 1) is JobStatus.FAILED
    ok(cli("retry", str(job_id)))
    job = get_job(cli.db, job_id)
    assert (job.status, job.failures) == (JobStatus.QUEUED, 0)


# -- dedup ------------------------------------------------------------------------------------


def dispatch(cli: Cli, key: str):
    result = cli("should-dispatch", key)
    assert result.returncode in (0, 10), (result.returncode, result.stderr)
    return result


def test_should_dispatch_follows_the_holder_of_the_key(cli):
    free = dispatch(cli, "issue-7")
    assert free.returncode == 0 and "dispatch" in free.stdout

    queued = cli.add(dedup_key="issue-7")
    held = dispatch(cli, "issue-7")
    assert held.returncode == 10
    assert held.stdout.strip() == f"skip: job {queued} is queued with dedup key 'issue-7'"
    assert dispatch(cli, "issue-8").returncode == 0

    ok(cli("cancel", str(queued)))
    assert dispatch(cli, "issue-7").returncode == 0

    failing = cli.add(command=("false",), dedup_key="issue-7", max_attempts=1)
    assert failing != queued
    assert end_job(cli.db, failing, Outcome.FAILED, 1) is JobStatus.FAILED
    assert dispatch(cli, "issue-7").returncode == 0

    done = cli.add(dedup_key="issue-7")
    assert end_job(cli.db, done, Outcome.OK, 0) is JobStatus.DONE
    held = dispatch(cli, "issue-7")
    assert held.returncode == 10
    assert f"job {done} is done" in held.stdout


def test_should_dispatch_skips_while_the_holder_runs(cli):
    job_id = cli.add(dedup_key="run-1")
    with open_store(cli.db) as store:
        (job,) = store.job_claim("h", "w", 1, get_job(cli.db, job_id).available_at)
        assert dispatch(cli, "run-1").returncode == 10
        assert store.attempt_start(job.token, 1, None, job.available_at)
    held = dispatch(cli, "run-1")
    assert held.returncode == 10
    assert f"job {job_id} is running" in held.stdout


def test_submit_with_a_held_dedup_key_prints_the_holder(cli):
    first = cli.submit("--dedup-key", "K", "--", "true")
    again = cli("submit", "--dedup-key", "K", "--", "echo", "different")
    assert submitted_id(again) == first
    assert f"held by job {first} (queued)" in again.stderr
    assert "'K'" in again.stderr
    forced = cli("submit", "--dedup-key", "K", "--force", "--", "true")
    assert submitted_id(forced) == first, "--force never releases an active holder"
    assert len(store_state(cli.db).jobs) == 1

    assert end_job(cli.db, first, Outcome.OK, 0) is JobStatus.DONE
    still = cli("submit", "--dedup-key", "K", "--", "true")
    assert submitted_id(still) == first
    assert "(done)" in still.stderr
    rerun = cli.submit("--dedup-key", "K", "--force", "--", "true")
    assert rerun != first
    assert get_job(cli.db, rerun).status is JobStatus.QUEUED
    assert get_job(cli.db, first).status is JobStatus.DONE
    held = dispatch(cli, "K")
    assert held.returncode == 10 and f"job {rerun} is queued" in held.stdout


# -- misc -------------------------------------------------------------------------------------


def test_migrate_prints_the_schema_version(cli):
    with open_store(cli.db) as store:
        version, dialect = store.schema_version(), store.dialect
    assert version >= 1
    assert ok(cli("migrate")).stdout.strip() == f"schema version {version} ({dialect})"


def test_migrate_creates_a_fresh_sqlite_database(tmp_path):
    result = ok(run_herder("migrate", cwd=tmp_path))
    assert result.stdout.startswith("schema version ")
    assert (tmp_path / "herder.db").is_file()


def test_db_precedence_flag_then_env_then_config_next_to_the_config(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "herder.toml").write_text('[herder]\ndb = "sqlite:///state/q.db"\n')
    (project / "state").mkdir()
    config = ["--config", str(project / "herder.toml")]
    ok(run_herder(*config, "migrate", cwd=tmp_path))
    assert (project / "state" / "q.db").is_file()
    assert not (tmp_path / "state").exists()

    ok(run_herder(*config, "migrate", cwd=tmp_path, env={"HERDER_DB": "sqlite:///env.db"}))
    assert (tmp_path / "env.db").is_file()

    ok(run_herder(*config, "--db", "sqlite:///flag.db", "migrate", cwd=tmp_path,
                  env={"HERDER_DB": "sqlite:///unused.db"}))
    assert (tmp_path / "flag.db").is_file()
    assert not (tmp_path / "unused.db").exists()


def test_help_of_every_command_works_without_config_or_database(tmp_path):
    (tmp_path / "herder.toml").write_text("this is = not [valid toml\n")
    calls = [["--help"]] + [[command, "--help"] for command in COMMANDS]
    results = run_many(calls, cwd=tmp_path, db=UNREACHABLE_DB)
    for args, result in zip(calls, results, strict=True):
        assert result.returncode == 0, (args, result.stderr)
        assert result.stdout.startswith("Usage: "), (args, result.stdout)
        assert result.stderr == "", (args, result.stderr)
        if len(args) == 2:
            assert f" {args[0]} " in result.stdout.splitlines()[0], (args, result.stdout)
    # `python -m herder.cli` offers every command the importable `herder.cli.main` has
    # (commands registered from other modules included).
    listing = results[0].stdout.split("Commands:\n", 1)[1]
    listed = {line.split()[0] for line in listing.splitlines() if line.startswith("  ")}
    assert listed == set(main.commands)
    assert set(COMMANDS) <= listed


def test_click_usage_errors_are_one_line_naming_the_flag(tmp_path):
    result = subprocess.run([sys.executable, "-m", "herder.cli", "submit", "--priority", "high",
                             "--", "true"], cwd=tmp_path, capture_output=True, text=True,
                            check=False)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("herder: error:") and "--priority" in lines[0]
    assert not (tmp_path / "herder.db").exists()
