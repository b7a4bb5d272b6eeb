"""Preflight: a job type's cheap check before a host takes it; a failing one keeps the job
queued for other hosts with nothing spent."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from support.processes import escaping_daemon
from support.waits import wait_for

from herder.core.errors import ConfigError
from herder.core.model import JobStatus
from herder.core.settings.loading import load_config
from herder.runtime.coordinator import preflight_checks
from herder.runtime.preflight import Check, Preflight, Result, default_check, run

AGENTCLI = """\
#!/bin/sh
# A stand-in for an agent CLI: answers --version, otherwise says where it ran.
if [ "$1" = "--version" ]; then echo "agentcli 1.0"; exit 0; fi
echo "agentcli ran on $HERDER_HOST"
"""


# -- the check itself -------------------------------------------------------------------------


def test_a_program_that_answers_passes_whatever_its_exit_unless_strict() -> None:
    assert run(Check((sys.executable, "--version"))).ok
    # `false --version` exits 1: the default check only asks that the program answer.
    assert run(Check(("false", "--version"))).ok
    strict = run(Check(("sh", "-c", "echo broken install >&2; exit 3"), strict=True))
    assert not strict.ok and "exit 3 broken install" in strict.detail


def test_a_missing_program_fails_naming_it() -> None:
    result = run(Check(("no-such-agent-cli-here", "--version")))
    assert not result.ok and "no-such-agent-cli-here" in result.detail


def test_a_hanging_check_is_killed_at_its_timeout_and_fails(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    result = run(Check(("sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"), timeout=0.5))
    assert not result.ok and "no answer within 0.5s" in result.detail
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # killed, and reaped by the check
        os.kill(pid, 0)


def test_a_check_sees_no_herder_credentials(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HERDER_AGENT_TOKEN", "hdr_secret")
    out = tmp_path / "env"
    assert run(Check(("sh", "-c", f"env > {out}"), strict=True)).ok
    assert "hdr_secret" not in out.read_text() and "PATH=" in out.read_text()


def test_results_are_cached_for_the_ttl_and_a_change_is_reported() -> None:
    clock = [100.0]
    answers = {"claude": True}
    runs: list[str] = []

    def runner(check: Check, _pass_env: object) -> Result:
        runs.append(check.argv[0])
        return Result(answers[check.argv[0]], "" if answers[check.argv[0]] else "gone",
                      clock[0])

    preflight = Preflight(ttl=45.0, runner=runner, clock=lambda: clock[0])
    checks = {"claude-issue": Check(("claude", "--version"))}
    assert preflight.refresh(checks) and preflight.failed() == {}
    clock[0] += 44.0
    answers["claude"] = False
    assert not preflight.refresh(checks) and runs == ["claude"]  # still cached
    clock[0] += 1.0
    assert preflight.refresh(checks)
    assert preflight.failed() == {"claude-issue": "gone"}
    # A type the server no longer checks is no longer held against the host.
    assert preflight.refresh({}) and preflight.failed() == {}


JOB_TYPES = """\
[job_types.claude-issue]
command = ["claude", "-p", "{prompt}"]

[job_types.custom]
command = ["aider"]
preflight = ["aider", "--check"]
preflight_timeout = "2s"

[job_types.off]
command = ["codex"]
preflight = false

[job_types.shell]
command = "make test"
shell = true
"""


def test_job_types_get_the_default_check_a_custom_one_or_none(tmp_path: Path) -> None:
    (tmp_path / "herder.toml").write_text(JOB_TYPES)
    checks = preflight_checks(load_config(tmp_path / "herder.toml").settings.job_types)
    assert sorted(checks) == ["claude-issue", "custom"]
    assert (checks["claude-issue"].argv, checks["claude-issue"].strict,
            checks["claude-issue"].timeout) == (["claude", "--version"], False, 5.0)
    assert (checks["custom"].argv, checks["custom"].strict, checks["custom"].timeout) == (
        ["aider", "--check"], True, 2.0)
    assert default_check("make test", shell=True) is None
    assert default_check(["./run.sh", "x"], shell=False) is None  # only in its workdir
    assert default_check(["{agent}", "x"], shell=False) is None
    assert default_check(["/usr/bin/env", "x"], shell=False) == Check(("/usr/bin/env",
                                                                         "--version"))


@pytest.mark.parametrize(("line", "problem"), [
    ("preflight = []", "job_types.t.preflight: the preflight command is empty"),
    ('preflight_timeout = "0s"', "job_types.t.preflight_timeout:"),
    ("preflight = 3", "job_types.t.preflight:"),
])
def test_a_bad_preflight_is_refused_naming_the_key(tmp_path: Path, line: str,
                                                    problem: str) -> None:
    (tmp_path / "herder.toml").write_text(f'[job_types.t]\ncommand = ["claude"]\n{line}\n')
    with pytest.raises(ConfigError, match=re.escape(problem)):
        load_config(tmp_path / "herder.toml")


# -- end to end -------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_host_whose_preflight_fails_is_passed_over_and_another_runs_the_job(
        make_fleet, tmp_path: Path, sqlite_url: str) -> None:
    """alpha cannot find `agentcli` on its PATH, beta can. The job waits while only alpha
    is up, naming alpha's failed preflight, with nothing spent; beta runs it."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "agentcli").write_text(AGENTCLI)
    (tools / "agentcli").chmod(0o755)
    fleet = make_fleet(tmp_path, sqlite_url, fleet={"alert_grace": "0s"},
                       extra='[job_types.agentic]\ncommand = ["agentcli", "work"]\n')
    fleet.add_hosts({"alpha": ("--ram", "16"), "beta": ("--ram", "16")})
    fleet.start_server()
    fleet.start_agent("alpha")

    def alpha_refuses() -> bool:
        host = fleet.store.host_get("alpha")
        info = host.agent_info if host is not None else {}
        return "agentic" in (info.get("preflight_failed") or {})

    wait_for(alpha_refuses, 30, "alpha to report its failed preflight", fleet.describe)
    job_id = fleet.submit(job_type="agentic")
    why = wait_for(lambda: "preflight" in (text := fleet.why(job_id)) and text, 30,
                   "why to name the preflight", fleet.describe)
    assert "alpha" in why and "agentcli" in why, why
    job = fleet.job(job_id)
    assert (job.status, job.attempt, job.failures, job.spawn_failures) == (
        JobStatus.QUEUED, 0, 0, 0), job

    # Queued work that no host is able to run raises one alert naming each host and why.
    [alert] = wait_for(lambda: [a for a in fleet.store.alert_list() if a.key == "fleet:stopped"],
                       30, "the fleet-stopped alert", fleet.describe)
    assert "alpha: preflight failed" in alert.message and "beta" in alert.message, alert

    fleet.start_agent("beta", env={"PATH": f"{tools}:{os.environ['PATH']}"})
    done = fleet.wait_status(job_id, JobStatus.DONE)
    assert (done.host, done.attempt, done.failures) == ("beta", 1, 0), done
    wait_for(lambda: not [a for a in fleet.store.alert_list() if a.key == "fleet:stopped"],
             30, "the alert to clear", fleet.describe)


# -- under `herder up` ----------------------------------------------------------------------------


def test_herder_up_claims_no_job_of_a_type_whose_preflight_fails_and_says_why(
        tmp_path: Path, store_url: str) -> None:
    """`herder up` runs the preflight too: without `agentcli` on its PATH the job stays
    queued with nothing spent, `why` and an alert say so, and `--exit-when-idle` does not
    wait for it forever; with it, the job runs and the alert clears."""
    from support.cli import run_herder

    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "agentcli").write_text(AGENTCLI)
    (tools / "agentcli").chmod(0o755)
    (tmp_path / "herder.toml").write_text(
        '[job_types.agentic]\ncommand = ["agentcli", "work"]\npreflight_cache = "1h"\n')
    bare_path = "/usr/bin:/bin"

    def herder(*args: str, path: str = bare_path):
        result = run_herder(*args, cwd=tmp_path, db=store_url, env={"PATH": path})
        assert result.returncode == 0, (args, result.stderr)
        return result

    job_id = int(herder("submit", "agentic", "--no-check").stdout)
    plain = int(herder("submit", "--", "true").stdout)  # no job type: no preflight
    up = herder("up", "--exit-when-idle", "--host", "solo")
    assert "preflight for job type agentic failed" in up.stderr
    assert "1 queued job(s) left" in up.stderr
    shown = json.loads(herder("show", str(job_id), "--json").stdout)
    assert (shown["status"], shown["attempt"], shown["failures"]) == ("queued", 0, 0)
    assert json.loads(herder("show", str(plain), "--json").stdout)["status"] == "done"
    why = herder("why", str(job_id)).stdout
    assert "but not now: preflight for job type agentic failed on solo: agentcli:" in why, why
    alerts = json.loads(herder("alerts", "--json").stdout)
    assert [a["key"] for a in alerts if a["key"].startswith("preflight:")] == [
        "preflight:solo:agentic"]

    herder("up", "--exit-when-idle", "--host", "solo", path=f"{tools}:{bare_path}")
    shown = json.loads(herder("show", str(job_id), "--json").stdout)
    assert (shown["status"], shown["attempt"]) == ("done", 1)
    assert not [a for a in json.loads(herder("alerts", "--json").stdout)
                if a["key"].startswith("preflight:")]


def test_a_check_is_cached_for_its_own_preflight_cache() -> None:
    clock = [0.0]
    ran: list[str] = []

    def runner(check: Check, _pass_env: object) -> Result:
        ran.append(check.argv[0])
        return Result(True, "", clock[0])

    preflight = Preflight(runner=runner, clock=lambda: clock[0])
    checks = {"short": Check(("a",), cache=10.0), "long": Check(("b",), cache=100.0)}
    preflight.refresh(checks)
    clock[0] = 50.0
    preflight.refresh(checks)
    assert ran == ["b", "a", "a"]  # sorted by type: long, short; then only short again


@pytest.mark.parametrize(("text", "problem"), [
    ('[job_types.t]\ncommand = ["x"]\npreflight_cache = "0s"\n', "job_types.t.preflight_cache:"),
    ('[job_types.t]\ncommand = ["x"]\nmax_transient_attempts = 0\n',
     "job_types.t.max_transient_attempts:"),
    ("[defaults]\nmax_transient_attempts = 0\n", "defaults.max_transient_attempts:"),
])
def test_bad_preflight_and_transient_settings_name_the_key(tmp_path: Path, text: str,
                                                           problem: str) -> None:
    (tmp_path / "herder.toml").write_text(text)
    with pytest.raises(ConfigError, match=re.escape(problem)):
        load_config(tmp_path / "herder.toml")


def test_herder_preflight_reads_its_checks_from_stdin_and_prints_verdicts(tmp_path: Path) -> None:
    """What the server runs on an ssh host: the checks on stdin (never on argv)."""
    import subprocess

    from support.cli import herder_argv
    from support.environment import clean_environment

    def preflight(text: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(herder_argv("preflight"), input=text, cwd=tmp_path,
                              env=clean_environment(), capture_output=True, text=True,
                              timeout=60, check=False)

    answer = preflight(json.dumps({"fine": {"argv": ["true"], "strict": True},
                                   "missing": {"argv": ["no-such-agentcli", "--version"]}}))
    assert answer.returncode == 0, answer.stderr
    assert json.loads(answer.stdout) == {
        "fine": {"ok": True, "detail": ""},
        "missing": {"ok": False, "detail": "no-such-agentcli: No such file or directory"}}
    for bad in ("[1]", "not json", '{"t": {"strict": true}}'):
        refused = preflight(bad)
        assert refused.returncode == 2
        assert refused.stderr.startswith("herder: error: stdin: not a set of preflight checks")


def test_a_daemon_the_check_left_holding_its_stderr_does_not_hold_the_runner(
        tmp_path: Path) -> None:
    """`herder up` claims nothing until the first preflights end: a check whose daemon
    (out of its killed group) keeps stderr open must still end at its timeout."""
    with escaping_daemon(tmp_path) as daemon:
        result = run(Check(daemon.argv, strict=True, timeout=1.0))
        assert not result.ok and "no answer within 1s" in result.detail
        daemon.assert_alive()
