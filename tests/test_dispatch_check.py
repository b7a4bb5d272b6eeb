"""`herder should-dispatch KEY --type T`: a job type's `dispatch_check` (seed 004's dedup
guard, e.g. "a merged pull request already closes this issue"), run as a real subprocess,
locally and through a server: exit 10 with its reason, 0, a failure or a timeout (exit 2),
and values that look like options or shell code stay values."""

from __future__ import annotations

import contextlib
import json
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.cli import run_herder
from support.processes import escaping_daemon
from support.waits import wait_for

from herder.core.access import new_token, token_hash
from herder.core.errors import ConfigError, InputError
from herder.core.model import Scope
from herder.core.settings.loading import load_config
from herder.services.dispatch_check import (
    DispatchCheckFailed,
    check_environment,
    check_payload,
    run_dispatch_check,
)

# The check: what its environment says decides; it records what it was given (argv and
# the HERDER_ variables) so a test can see a value arrived as data.
CHECK = """
import json, os, sys, time
seen = {"argv": sys.argv[1:], "env": {k: v for k, v in os.environ.items()
                                      if k.startswith("HERDER_")}}
with open(os.environ["CHECK_RECORD"], "a") as out:
    out.write(json.dumps(seen) + "\\n")
state = os.environ.get("HERDER_PAYLOAD_STATE", "")
if state == "merged":
    print()
    print("PR #12 (merged) closes", os.environ["HERDER_DEDUP_KEY"])
    print("more output")
    sys.exit(10)
if state == "broken":
    print("gh: HTTP 502", file=sys.stderr)
    sys.exit(3)
if state == "hang":
    time.sleep(600)
sys.exit(0)
"""


def config_text(folder: Path, timeout: str = "5s") -> str:
    check = folder / "check.py"
    check.write_text(CHECK)
    return (f'[job_types.issue]\ncommand = ["true"]\n'
            f'dispatch_check = [{json.dumps(sys.executable)}, {json.dumps(str(check))}, '
            f'"--fixed"]\n'
            f'dispatch_check_timeout = "{timeout}"\n'
            '[job_types.plain]\ncommand = ["true"]\n')


def records(folder: Path) -> list[dict[str, object]]:
    path = folder / "record.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "herder.toml").write_text(config_text(tmp_path, timeout="2s"))
    return tmp_path


def should_dispatch(project: Path, db: str, *args: str):
    return run_herder("should-dispatch", *args, cwd=project, db=db,
                      env={"CHECK_RECORD": str(project / "record.jsonl"),
                           "HERDER_API_TOKEN": "hdr_secret-of-the-server"})


# -- the runner (real subprocesses) ------------------------------------------------------------


def test_the_contract_dispatch_skip_with_its_reason_and_errors(tmp_path: Path) -> None:
    def run(script: str, timeout: float = 10.0) -> str | None:
        return run_dispatch_check([sys.executable, "-c", script], timeout,
                                  {"PATH": "/usr/bin:/bin"}, "job_types.t.dispatch_check")

    assert run("pass") is None
    assert run("print('already shipped'); raise SystemExit(10)") == "already shipped"
    assert run("raise SystemExit(10)") == "the dispatch check said skip"
    with pytest.raises(DispatchCheckFailed, match=re.escape(
            "job_types.t.dispatch_check: exit 3: no network (0 is dispatch, 10 skip)")):
        run("import sys; print('no network', file=sys.stderr); sys.exit(3)")
    with pytest.raises(DispatchCheckFailed, match="killed by signal 9"):
        run("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    with pytest.raises(DispatchCheckFailed, match="cannot start"):
        run_dispatch_check([str(tmp_path / "missing")], 5, {}, "job_types.t.dispatch_check")


def test_a_hanging_check_and_what_it_started_are_killed_at_the_timeout(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    # A shell starts in milliseconds (a Python child may take seconds on a loaded machine),
    # so its grandchild is there well before the timeout.
    script = 'sleep 600 & echo $! > "$1"; sleep 600'
    with pytest.raises(DispatchCheckFailed, match=r"no answer within 5s"):
        run_dispatch_check(["/bin/sh", "-c", script, "check", str(pid_file)], 5.0,
                           {"PATH": "/usr/bin:/bin"}, "job_types.t.dispatch_check")
    grandchild = int(pid_file.read_text())
    status = Path(f"/proc/{grandchild}/stat")

    def ended() -> bool:  # gone, or a zombie until its reaper (init) collects it
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            return status.read_text().rsplit(")", 1)[1].split()[0] == "Z"
        return True

    # SIGKILL to its group is sent at the timeout; the kernel ends it a moment later.
    wait_for(ended, 30, "the check's grandchild to be killed with its group")


def test_values_reach_the_check_only_as_environment_variables() -> None:
    env = check_environment({"PATH": "/bin", "HERDER_PAYLOAD_X": "from-the-host"}, "issue",
                            "repo#7", {"x": "$(id)", "issue": "--force"})
    assert env == {"PATH": "/bin", "HERDER_PAYLOAD_X": "$(id)", "HERDER_PAYLOAD_ISSUE": "--force",
                   "HERDER_JOB_TYPE": "issue", "HERDER_DEDUP_KEY": "repo#7"}


# -- the command line, against the database ------------------------------------------------------


def test_should_dispatch_runs_the_types_check_once_the_key_is_free(project: Path,
                                                                    store_url: str) -> None:
    skipped = should_dispatch(project, store_url, "repo#7", "--type", "issue", "-p",
                              "state=merged")
    assert skipped.returncode == 10, skipped.stderr
    assert skipped.stdout == ("skip: PR #12 (merged) closes repo#7 "
                              "(job_types.issue.dispatch_check)\n")
    free = should_dispatch(project, store_url, "repo#8", "--type", "issue", "-p", "state=open")
    assert free.returncode == 0, free.stderr
    assert free.stdout == "dispatch: no job holds 'repo#8'\n"
    broken = should_dispatch(project, store_url, "repo#9", "--type", "issue", "-p",
                             "state=broken")
    assert broken.returncode == 2
    assert broken.stderr == ("herder: error: job_types.issue.dispatch_check: exit 3: gh: HTTP "
                             "502 (0 is dispatch, 10 skip)\n")
    hanging = should_dispatch(project, store_url, "repo#9", "--type", "issue", "-p",
                              "state=hang")
    assert hanging.returncode == 2
    assert hanging.stderr == ("herder: error: job_types.issue.dispatch_check: no answer "
                              "within 2s\n")
    # without --type, and for a type without a check: the key alone decides, nothing runs
    before = len(records(project))
    assert should_dispatch(project, store_url, "repo#7").returncode == 0
    assert should_dispatch(project, store_url, "repo#7", "--type", "plain").returncode == 0
    assert len(records(project)) == before
    # the check sees the key and the payload, never herder's secrets
    first = records(project)[0]
    assert first["argv"] == ["--fixed"]
    assert first["env"] == {"HERDER_DEDUP_KEY": "repo#7", "HERDER_JOB_TYPE": "issue",
                            "HERDER_PAYLOAD_STATE": "merged"}


def test_a_held_key_skips_without_running_the_check(project: Path, store_url: str) -> None:
    submitted = run_herder("submit", "issue", "--dedup-key", "repo#7", "--delay", "1h",
                           cwd=project, db=store_url)
    assert submitted.returncode == 0, submitted.stderr
    held = should_dispatch(project, store_url, "repo#7", "--type", "issue", "-p",
                           "state=open")
    assert held.returncode == 10
    assert held.stdout.startswith(f"skip: job {submitted.stdout.strip()} is queued")
    assert records(project) == []


def test_hostile_values_stay_values(project: Path, store_url: str) -> None:
    marker = project / "pwned"
    hostile = [f"$(touch {marker})", f"`touch {marker}`", "--exec=touch", "-rf", "; id #"]
    for value in hostile:
        result = should_dispatch(project, store_url, "--type", "issue", "-p",
                                 f"state={value}", "-p", f"title={value}", "--", value)
        assert result.returncode == 0, (value, result.stderr)
    assert not marker.exists()
    seen = records(project)
    assert [entry["argv"] for entry in seen] == [["--fixed"]] * len(hostile)
    assert [entry["env"] for entry in seen] == [  # type: ignore[index]
        {"HERDER_DEDUP_KEY": value, "HERDER_JOB_TYPE": "issue", "HERDER_PAYLOAD_STATE": value,
         "HERDER_PAYLOAD_TITLE": value} for value in hostile]


@pytest.mark.parametrize(("args", "problem"), [
    (("--type", "nope"), "--type: no job type 'nope' in herder.toml"),
    (("--type", "issue", "-p", "bad-name=1"), "-p: 'bad-name' cannot become"),
    (("--type", "issue", "-p", "novalue"), "-p: 'novalue' is not FIELD=VALUE"),
    (("-p", "state=open"), "-p: a payload is for a job type's dispatch_check"),
])
def test_bad_options_exit_2_naming_the_option(project: Path, sqlite_url: str,
                                             args: tuple[str, ...], problem: str) -> None:
    result = should_dispatch(project, sqlite_url, "repo#7", *args)
    assert result.returncode == 2
    assert result.stderr.startswith(f"herder: error: {problem}"), result.stderr
    assert records(project) == []


@pytest.mark.parametrize(("line", "problem"), [
    ("dispatch_check = []", "job_types.t.dispatch_check: the command is empty"),
    ('dispatch_check = ["gh", "pr", "list", "--search", "{issue}"]',
     "job_types.t.dispatch_check: '{issue}': the check's argv is not a template"),
    ('dispatch_check = ["./check"]\ndispatch_check_timeout = "0s"',
     "job_types.t.dispatch_check_timeout:"),
])
def test_a_bad_dispatch_check_is_refused_naming_the_key(tmp_path: Path, line: str,
                                                        problem: str) -> None:
    (tmp_path / "herder.toml").write_text(f'[job_types.t]\ncommand = ["true"]\n{line}\n')
    with pytest.raises(ConfigError, match=re.escape(problem)):
        load_config(tmp_path / "herder.toml")
    result = run_herder("should-dispatch", "k", "--type", "t", cwd=tmp_path,
                        db=f"sqlite:///{tmp_path}/herder.db")
    assert result.returncode == 2 and problem in result.stderr
    if "{issue}" in line:
        assert "$HERDER_PAYLOAD_ISSUE" in result.stderr


# -- through a server ------------------------------------------------------------------------------


def test_the_server_runs_its_own_check_for_a_token_that_may_submit_the_type(
        make_fleet, tmp_path: Path, store_url: str) -> None:
    fleet = make_fleet(tmp_path, store_url, extra=config_text(tmp_path, timeout="2s"))
    fleet.start_server(env={"CHECK_RECORD": str(tmp_path / "record.jsonl")})
    operator = tmp_path / "operator"  # no herder.toml, no check here: the server's runs
    operator.mkdir()

    def token(scope: Scope, job_types: frozenset[str] | None = None) -> Path:
        secret = new_token()
        fleet.store.token_insert(f"t-{scope}-{job_types}", scope, token_hash(secret),
                                 datetime.now(UTC), job_types=job_types)
        path = operator / f"token-{scope}-{len(job_types or ())}"
        path.write_text(secret + "\n")
        path.chmod(0o600)
        return path

    def over(token_path: Path, *args: str):
        return run_herder("should-dispatch", *args, cwd=operator,
                          env={"HERDER_SERVER": fleet.url, "HERDER_TOKEN_FILE": str(token_path)})

    submitter = token(Scope.SUBMIT, frozenset({"issue"}))
    skipped = over(submitter, "repo#7", "--type", "issue", "-p", "state=merged")
    assert skipped.returncode == 10, skipped.stderr
    assert skipped.stdout == ("skip: PR #12 (merged) closes repo#7 "
                              "(job_types.issue.dispatch_check)\n")
    assert over(submitter, "repo#8", "--type", "issue", "-p", "state=open").returncode == 0
    broken = over(submitter, "repo#9", "--type", "issue", "-p", "state=broken")
    assert broken.returncode == 2
    assert broken.stderr == ("herder: error: job_types.issue.dispatch_check: exit 3: gh: HTTP "
                             "502 (0 is dispatch, 10 skip)\n")
    hanging = over(submitter, "repo#9", "--type", "issue", "-p", "state=hang")
    assert hanging.returncode == 2 and "no answer within 2s" in hanging.stderr
    marker = tmp_path / "pwned"
    hostile = over(submitter, f"$(touch {marker})", "--type", "issue", "-p",
                   f"state=--exec=touch {marker}")
    assert hostile.returncode == 0, hostile.stderr
    assert not marker.exists()
    assert records(tmp_path)[-1]["env"] == {
        "HERDER_DEDUP_KEY": f"$(touch {marker})", "HERDER_JOB_TYPE": "issue",
        "HERDER_PAYLOAD_STATE": f"--exec=touch {marker}"}
    assert records(tmp_path)[-1]["argv"] == ["--fixed"]
    ran = len(records(tmp_path))
    # who may not make the server run it: a reader, a submitter of other types
    reader = over(token(Scope.READ), "repo#8", "--type", "issue", "-p", "state=open")
    assert reader.returncode == 2 and "token refused" in reader.stderr
    other = over(token(Scope.SUBMIT, frozenset({"plain"})), "repo#8", "--type", "issue")
    assert other.returncode == 2 and "may not act on job type 'issue'" in other.stderr
    unknown = over(submitter, "repo#8", "--type", "nope")
    assert unknown.returncode == 2 and "nope" in unknown.stderr
    assert len(records(tmp_path)) == ran
    # the server's secrets never reach the check
    assert all(name in {"HERDER_DEDUP_KEY", "HERDER_JOB_TYPE", "HERDER_PAYLOAD_STATE"}
               for entry in records(tmp_path) for name in entry["env"])  # type: ignore[attr-defined]


def test_the_server_runs_at_most_four_checks_at_once_and_refuses_a_fifth_at_once() -> None:
    """A fifth caller is told to try again, not parked on one of the server's threads."""
    import threading

    from herder.api.jobs import DISPATCH_CHECKS, _bounded

    release = threading.Event()
    entered = threading.Semaphore(0)

    def hanging(_job_type: str, _key: str, _payload: object) -> str | None:
        entered.release()
        release.wait(60)
        return None

    threads = [threading.Thread(target=_bounded, args=(hanging, "issue", f"k{n}", {}))
               for n in range(DISPATCH_CHECKS)]
    for thread in threads:
        thread.start()
    try:
        for _ in threads:
            assert entered.acquire(timeout=30)
        with pytest.raises(DispatchCheckFailed, match="runs 4 dispatch checks already"):
            _bounded(hanging, "issue", "k-more", {})
    finally:
        release.set()
        for thread in threads:
            thread.join(30)
    assert _bounded(lambda *_: "done", "issue", "k-after", {}) == "done"


def test_a_daemon_the_check_left_holding_its_output_does_not_hold_the_caller(
        tmp_path: Path) -> None:
    """An escaped descendant (setsid: out of the killed group) keeping stdout open: the
    caller gets its error at the timeout, not when the daemon ends."""
    with escaping_daemon(tmp_path) as daemon:
        with pytest.raises(DispatchCheckFailed, match=r"no answer within 1s"):
            run_dispatch_check(list(daemon.argv), 1.0, {"PATH": "/usr/bin:/bin"},
                               "job_types.t.dispatch_check")
        daemon.assert_alive()


@pytest.mark.parametrize("payload", [{"issue\n": "7"}, {"issue": "7", "ISSUE": "8"}])
def test_a_field_that_is_no_variable_name_or_clashes_with_another_is_refused(
        payload: dict[str, str]) -> None:
    with pytest.raises(InputError, match=r"HERDER_PAYLOAD_ISSUE"):
        check_payload(payload)


def test_an_empty_key_is_an_error_not_a_dispatch(project: Path, sqlite_url: str) -> None:
    """A dispatcher whose key variable came out empty must not dispatch blind (no job can
    hold an empty key, so the answer would always be 0), nor run the check."""
    result = should_dispatch(project, sqlite_url, "", "--type", "issue")
    assert result.returncode == 2, result.stdout
    assert result.stderr.startswith("herder: error: KEY: ")
    assert records(project) == []
