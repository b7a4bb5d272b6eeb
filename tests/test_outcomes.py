# ruff: noqa: E501 (the fake agent prints real agents' long lines)
"""Issue 14 end to end under `herder up`: a fake agent CLI ends in each way an AI agent
does, and the job's state, counters, wait, weight and flags follow the outcome table."""

from __future__ import annotations

import json
import signal
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from support.local import Harness
from support.waits import wait_for

from herder.core.model import AttemptResult, Decision, Job, JobStatus, Outcome

FAKE_AGENT = """\
#!/bin/sh
# A stand-in for an AI agent CLI: ends the way the first argument says.
case "$1" in
  ratelimit)
    echo 'I will start with the failing test.'
    echo 'API Error: 429 {"type":"error","error":{"type":"rate_limit_error","message":"rate limited"}}'
    echo 'Retry-After: 120'
    exit 1 ;;
  usage) echo "Claude AI usage limit reached|$2"; exit 1 ;;
  revoked)
    echo 'API Error: 401 {"type":"error","error":{"type":"authentication_error","message":"OAuth access token has been revoked."}} · Please run /login'
    exit 1 ;;
  heavier) echo "this task needs more memory"; exit 4 ;;
  ram) exit 3 ;;
  result)
    printf '{"outcome": "failed", "failure_reason": "mutex_collision", "summary": "issue 412 is held by another worker", "cost_usd": 0.03}' > "$HERDER_RESULT"
    exit 0 ;;
  silent) echo "thinking..."; exec sleep 300 ;;
  badresult) printf '{"outcome": "ok", "colour": "red"}' > "$HERDER_RESULT"; exit 0 ;;
  ok)
    echo '{"type":"result","subtype":"success","is_error":false,"num_turns":4,"total_cost_usd":0.25,"result":"Opened PR #88"}'
    exit 0 ;;
esac
echo "unknown mode $1"; exit 1
"""


def agent_job_type(folder: Path, extra: str = "") -> str:
    """herder.toml's [job_types.agent], running the fake agent written into `folder`."""
    script = folder / "fake-agent"
    script.write_text(FAKE_AGENT)
    script.chmod(0o755)
    return (f'[job_types.agent]\ncommand = ["{script}", "{{mode}}", "{{arg}}"]\n'
            f'weight = "light"\npreflight = false\noption_fields = ["arg"]\n{extra}')


@pytest.fixture
def agent_harness(tmp_path: Path, sqlite_url: str):
    h = Harness(tmp_path, sqlite_url, extra_config=agent_job_type(
        tmp_path, "max_attempts = 1\n\n[job_types.quiet]\n"
        f'command = ["{tmp_path / "fake-agent"}", "silent"]\nsilence_timeout = "1s"\n'
        "max_attempts = 1\npreflight = false\n"))
    try:
        yield h
    finally:
        h.close()


def finished_event(h: Harness, job_id: int, attempt: int = 1) -> tuple[datetime, dict]:
    [event] = [e for e in h.events(job_id) if e.kind == "finished" and e.attempt == attempt]
    return event.at, dict(event.detail)


@pytest.mark.slow
def test_each_ending_of_an_agent_follows_the_outcome_table(agent_harness: Harness):
    h = agent_harness
    reset = int(time.time()) + 7200
    jobs = {mode: h.client.submit("agent", payload={"mode": mode, "arg": str(reset)}).job_id
            for mode in ("ratelimit", "usage", "revoked", "heavier", "ram", "result",
                         "badresult", "ok")}
    jobs["silent"] = h.client.submit("quiet").job_id
    up = h.up("--concurrency", "9")
    try:
        def settled(mode: str, check) -> Job:  # type: ignore[no-untyped-def]
            return wait_for(lambda: (job := h.job(jobs[mode])) and check(job) and job, 60,
                            f"the {mode} job to settle", h.describe)

        # A rate limit: its own budget, at least what Retry-After asked, nothing else spent.
        limited = settled("ratelimit", lambda j: j.transient_attempts == 1)
        at, detail = finished_event(h, limited.id)
        assert (limited.status, limited.failures, limited.failure_reason) == (
            JobStatus.QUEUED, 0, "transient")
        assert limited.available_at == at + timedelta(seconds=120)
        assert (detail["outcome"], detail["source"], detail["retry_after"]) == (
            "transient", "log", 120.0)
        assert "429" in detail["evidence"]

        # A usage limit: waits for the reset it printed, spends nothing, avoids the host.
        blocked = settled("usage", lambda j: j.failure_reason == "usage_blocked")
        assert (blocked.status, blocked.failures, blocked.transient_attempts) == (
            JobStatus.QUEUED, 0, 0)
        assert blocked.available_at == datetime.fromtimestamp(reset, UTC)

        # A revoked login: failed at once, for a human.
        revoked = settled("revoked", lambda j: j.status is JobStatus.FAILED)
        assert (revoked.failure_reason, revoked.human_action, revoked.actionable) == (
            "spawn_oauth_expired", True, True)
        # The alert is opened just after the failed status is committed: wait for it.
        [alert] = wait_for(lambda: [a for a in h.store.alert_list()
                                    if a.key == f"job:{revoked.id}:human_action"], 30,
                           "the human-action alert")
        assert "a human must act" in alert.message and "spawn_oauth_expired" in alert.message

        # Exit 4 climbs the weight chain to ever bigger budgets (light, heavy, then
        # orchestrator: playwright books less than heavy), then fails at its end.
        heavier = settled("heavier", lambda j: j.status is JobStatus.FAILED)
        assert (heavier.weight, heavier.escalations, heavier.failure_reason) == (
            "orchestrator", 2, "spawn_oom")
        assert [a.outcome for a in h.attempts(heavier.id)] == [Outcome.NEEDS_HEAVIER] * 3
        assert finished_event(h, heavier.id, 3)[1]["note"] == (
            "cannot find capacity for orchestrator")

        # Exit 3: RAM contention spends a spawn failure and waits the spawn backoff.
        ram = settled("ram", lambda j: j.spawn_failures == 1)
        at, _ = finished_event(h, ram.id)
        assert (ram.status, ram.failures, ram.failure_reason) == (
            JobStatus.QUEUED, 0, "spawn_ram")
        assert ram.available_at == at + timedelta(seconds=300)

        # The job's own word wins over its exit 0, and its reason is recorded.
        said = settled("result", lambda j: j.status.terminal)
        assert (said.status, said.failure_reason) == (JobStatus.FAILED, "mutex_collision")
        _, detail = finished_event(h, said.id)
        assert detail["source"] == "result" and detail["cost_usd"] == 0.03
        assert detail["result"]["summary"] == "issue 412 is held by another worker"

        # A result with an unknown field is recorded as such and ignored.
        ignored = settled("badresult", lambda j: j.status.terminal)
        _, detail = finished_event(h, ignored.id)
        assert ignored.status is JobStatus.DONE
        assert detail["result_error"].startswith("colour: Extra inputs are not permitted")

        # An agent that goes silent past its job type's silence_timeout is stuck.
        stuck = settled("silent", lambda j: j.status.terminal)
        assert (stuck.status, stuck.failure_reason, stuck.actionable) == (
            JobStatus.FAILED, "stuck", True)
        assert [a.outcome for a in h.attempts(stuck.id)] == [Outcome.STUCK]
        assert "stopped as stuck" in h.cli("logs", str(stuck.id)).stdout

        # Done, with what Claude Code's structured result said it cost.
        done = settled("ok", lambda j: j.status.terminal)
        _, detail = finished_event(h, done.id)
        assert (done.status, detail["cost_usd"], detail["turns"]) == (JobStatus.DONE, 0.25, 4)
    finally:
        up.send_signal(signal.SIGTERM)
        h.wait_exit(up, 30, "herder up")
    h.cli("retry", str(jobs["revoked"]))  # someone logged in again: the alert clears
    open_keys = {a.key for a in h.store.alert_list()}
    assert not {key for key in open_keys if key.startswith(f"job:{jobs['revoked']}:")}
    # Actionable failures stay open until retried (issue 16's job-failed alert).
    assert f"job:{jobs['silent']}:failed" in open_keys
    shown = h.cli("show", str(jobs["result"])).stdout
    assert "issue 412 is held by another worker" in shown, shown
    as_json = json.loads(h.cli("show", str(jobs["ratelimit"]), "--json").stdout)
    assert (as_json["transient_attempts"], as_json["spawn_failures"], as_json["attempt"],
            as_json["lost"]) == (1, 0, 1, 0)
    assert (as_json["outcome"], as_json["actionable"], as_json["human_action"]) == (
        "transient", False, False)


@pytest.mark.slow
def test_the_server_judges_what_an_agent_reports(make_fleet, tmp_path: Path, sqlite_url: str):
    """An agent sends the log's tail and $HERDER_RESULT with its finish; the server, which
    knows the job types, judges it: a rate limit on an agent is transient there too, and a
    usage limit keeps the job off that host while another can take it."""
    fleet = make_fleet(tmp_path, sqlite_url, extra=agent_job_type(tmp_path))
    fleet.add_hosts({"alpha": ("--ram", "16")})
    fleet.start_server()
    fleet.start_agent("alpha")
    limited = fleet.submit(job_type="agent", payload={"mode": "ratelimit", "arg": "-"})
    job = wait_for(lambda: (j := fleet.job(limited)) and j.transient_attempts == 1 and j, 60,
                   "the rate-limited job to be judged", fleet.describe)
    assert (job.status, job.failures, job.failure_reason) == (JobStatus.QUEUED, 0, "transient")
    [event] = [e for e in fleet.store.event_list(limited) if e.kind == "finished"]
    assert job.available_at == event.at + timedelta(seconds=120)
    assert (event.detail["source"], event.detail["retry_after"]) == ("log", 120.0)

    blocked = fleet.submit(job_type="agent", payload={"mode": "usage",
                                                      "arg": str(int(time.time()) + 3600)})
    job = wait_for(lambda: (j := fleet.job(blocked)) and j.failure_reason == "usage_blocked"
                   and j, 60, "the usage-limited job to be judged", fleet.describe)
    assert (job.status, job.failures) == (JobStatus.QUEUED, 0)
    [due] = [d for d in fleet.store.job_list_due(job.available_at, 10) if d.id == blocked]
    assert due.avoid_host == "alpha"


@pytest.mark.slow
def test_a_run_of_rate_limits_opens_the_hosts_breaker_for_the_type_then_one_trial_closes_it(
        make_fleet, tmp_path: Path, sqlite_url: str):
    """Three transient outcomes in a row of one job type on alpha open alpha's breaker for
    that type: the next job of the type waits (why and hosts say so) with nothing spent;
    after the pause one trial job runs, and its success closes the breaker."""
    fleet = make_fleet(tmp_path, sqlite_url, fleet={"breaker_pause": "10s"},
                       extra=agent_job_type(tmp_path))
    fleet.add_hosts({"alpha": ("--ram", "16", "--prime-workers", "1",
                               "--night-workers", "1")})
    fleet.start_server()
    fleet.start_agent("alpha")
    limited = [fleet.submit(job_type="agent", payload={"mode": "ratelimit", "arg": "-"})
               for _ in range(3)]
    wait_for(lambda: all(fleet.job(job).transient_attempts == 1 for job in limited), 60,
             "three rate limits on alpha", fleet.describe)
    trial = fleet.submit(job_type="agent", payload={"mode": "ok", "arg": "-"})
    why = wait_for(lambda: "breaker open" in (text := fleet.why_api(trial)) and text, 30,
                   "why to name the open breaker", fleet.describe)
    assert "alpha" in why and "3 transient outcomes in a row" in why, why
    assert "breaker open" in fleet.hosts_api()["alpha"]["breakers"]["agent"]
    [alert] = wait_for(lambda: [a for a in fleet.store.alert_list()
                                if a.key == "breaker:alpha:agent"], 30, "the breaker's alert")
    assert "3 transient outcomes in a row" in alert.message
    assert fleet.job(trial).attempt == 0  # nothing spent while it waits
    done = fleet.wait_status(trial, JobStatus.DONE)
    assert (done.host, done.attempt) == ("alpha", 1)
    last_limit = max(e.at for job in limited for e in fleet.store.event_list(job)
                     if e.kind == "finished")
    [claimed] = [e.at for e in fleet.store.event_list(trial) if e.kind == "placed"]
    assert claimed >= last_limit + timedelta(seconds=10), "the trial did not wait the pause"
    wait_for(lambda: not fleet.hosts_api()["alpha"]["breakers"], 30,
             "the breaker to close", fleet.describe)
    wait_for(lambda: not [a for a in fleet.store.alert_list() if a.key.startswith("breaker:")],
             30, "the breaker's alert to clear", fleet.describe)


def test_jobs_actionable_lists_the_failures_someone_should_look_at(agent_harness: Harness):
    """A revoked login (a human's job) and a code fault are actionable; a usage limit is
    weather."""
    h = agent_harness
    store = h.store
    revoked, weather = (h.client.submit("agent", payload={"mode": mode, "arg": "-"}).job_id
                        for mode in ("revoked", "usage"))
    for job in store.job_claim(h.host, "w1", 2, datetime.now(UTC)):
        flagged = job.id == revoked
        store.attempt_finish([AttemptResult(job.token, Outcome.FAILED, 1, Decision(
            JobStatus.FAILED, failure_reason="x", actionable=flagged, human_action=flagged))],
            datetime.now(UTC))
    listed = h.cli("jobs", "--status", "failed", "--actionable", "--json").stdout
    assert [job["id"] for job in json.loads(listed)] == [revoked]
    assert weather != revoked


def test_log_on_success_reads_aider_s_log_after_its_exit_0(tmp_path: Path, sqlite_url: str):
    # aider ends 0 after an API error; its recorded output is replayed by a stand-in.
    corpus = Path(__file__).parent / "fixtures" / "clients" / "aider-openai"
    replay = tmp_path / "fake-aider"
    replay.write_text('#!/bin/sh\ncat "$1"\nexit 0\n')
    replay.chmod(0o755)
    config = "".join(
        f'[job_types.{name}]\ncommand = ["{replay}", "{{file}}"]\nweight = "light"\n'
        f'preflight = false\nmax_attempts = 1\nlog_on_success = {flag}\n\n'
        for name, flag in (("aider", "true"), ("plain", "false")))
    h = Harness(tmp_path, sqlite_url, extra_config=config)
    try:
        jobs = {(name, case): h.client.submit(
                    name, payload={"file": str(corpus / f"{case}.txt")}).job_id
                for name in ("aider", "plain")
                for case in ("auth_invalid", "insufficient_quota", "rate_limit")}
        up = h.up("--concurrency", "6")
        try:
            def ended(job_id: int) -> Job | None:  # done, failed, or waiting for a reset
                job = h.job(job_id)
                return job if job and (job.status.terminal or job.failure_reason) else None

            settled = {key: wait_for(lambda job_id=job_id: ended(job_id), 60,
                                     f"job {key} to settle", h.describe)
                       for key, job_id in jobs.items()}
        finally:
            up.send_signal(signal.SIGTERM)
            h.wait_exit(up, 30, "herder up")
        assert (settled["aider", "auth_invalid"].status,
                settled["aider", "auth_invalid"].failure_reason) == (
            JobStatus.FAILED, "spawn_oauth_expired")
        assert settled["aider", "insufficient_quota"].failure_reason == "usage_blocked"
        # A 429 it printed may have been retried inside aider: exit 0 stays done.
        assert settled["aider", "rate_limit"].status is JobStatus.DONE
        # Without the setting, exit 0 is done whatever the log says.
        assert {settled["plain", case].status for case in (
            "auth_invalid", "insufficient_quota", "rate_limit")} == {JobStatus.DONE}
    finally:
        h.close()
