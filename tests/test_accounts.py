"""Accounts end to end (issue 15 item 1, issue 24 item 1): the job that hits its account's
usage limit, or finds its login revoked, runs again at once under another account with
nothing spent; once every account is blocked it waits for the earliest reset without
spending anything (and the fleet-stopped alert names the host and its accounts), and the
first account is used again once its reset passes. Each depleted or revoked account raises
`account:<host>:<name>`, cleared with it. Probes that print garbage or hang keep their
account, one that finds a dead token removes it, one that reports its quota ranks it. Under
`herder up` on both backends, and through a server and an agent."""

from __future__ import annotations

import json
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.local import Harness
from support.waits import holds_for, wait_for

from herder.core.model import JobStatus

FAKE_AGENT = """\
#!/bin/sh
# A stand-in for an AI agent CLI under an account: $WHO names the account (its env);
# a file named after it in $LIMITS holds the reset time of a usage limit it has hit, one
# named $WHO.revoked says its login was revoked.
echo "$WHO" >> "$RUNS"
if [ -f "$LIMITS/$WHO.revoked" ]; then
  echo "API Error: 401 OAuth access token has been revoked. Please run /login"
  exit 1
fi
if [ -f "$LIMITS/$WHO" ]; then
  echo "Claude AI usage limit reached|$(cat "$LIMITS/$WHO")"
  exit 1
fi
echo "done under $WHO"
"""
DEAD = ('{"credentials_present": true, "has_refresh_token": false, '
        '"access_expired": true}')
SECRET = "sk-never-shown-4711"


def job_type(folder: Path) -> str:
    script = folder / "fake-agent"
    script.write_text(FAKE_AGENT)
    script.chmod(0o755)
    (folder / "limits").mkdir()
    return (f'[job_types.agent]\ncommand = ["{script}"]\naccounts = true\nmax_attempts = 1\n'
            f'preflight = false\nenv = {{RUNS = "{folder / "runs"}", '
            f'LIMITS = "{folder / "limits"}"}}\n')


def accounts_config(folder: Path, host: str) -> str:
    """Three accounts on `host`: alpha's probe finds a dead token (it would come first by
    name), first's prints garbage, second's hangs past its timeout."""
    garbage = folder / "garbage-probe"
    garbage.write_text("#!/bin/sh\necho 'credentials: yes please'\n")
    garbage.chmod(0o755)
    dead = folder / "dead-probe"
    dead.write_text(f"#!/bin/sh\necho '{DEAD}'\n")
    dead.chmod(0o755)
    return (f'\n[hosts.{host}]\nram_total_gb = 16\ntransport = "local"\n'
            f'[hosts.{host}.accounts.alpha]\nenv = {{WHO = "alpha"}}\nprobe = ["{dead}"]\n'
            f'[hosts.{host}.accounts.first]\nenv = {{WHO = "first", API_KEY = "{SECRET}"}}\n'
            f'probe = ["{garbage}"]\n'
            f'[hosts.{host}.accounts.second]\nenv = {{WHO = "second"}}\n'
            'probe = ["sleep", "300"]\nprobe_timeout = "1s"\n')


def runs(folder: Path) -> list[str]:
    path = folder / "runs"
    return path.read_text().split() if path.exists() else []


def account_of(store, job_id: int, attempt: int) -> str:  # type: ignore[no-untyped-def]
    [event] = [e for e in store.event_list(job_id) if e.kind == "account"
               and e.attempt == attempt]
    return str(event.detail["account"])


def alert_keys(store) -> set[str]:  # type: ignore[no-untyped-def]
    return {alert.key for alert in store.alert_list()}


def limit(folder: Path, account: str, seconds: float) -> datetime:
    """The account's next run hits its usage limit, which resets in `seconds`."""
    reset = int(time.time() + seconds)
    (folder / "limits" / account).write_text(str(reset))
    return datetime.fromtimestamp(reset, UTC)


@pytest.mark.slow
def test_accounts_rotate_wait_for_their_reset_and_probes_fail_open(tmp_path: Path,
                                                                    store_url: str):
    h = Harness(tmp_path, store_url, extra_config=job_type(tmp_path))
    try:
        with open(h.config, "a") as config:
            config.write(accounts_config(tmp_path, h.host))
        up = h.up("--concurrency", "1")
        try:
            h.wait_ready(up)
            store = h.store
            # Every probe has answered: the garbage and the hang are unknown (healthy).
            probed = wait_for(lambda: (found := {r.account.name: r.health
                                                 for r in store.account_list(h.host)})
                              and all(v.probed_at for v in found.values()) and found, 60,
                              "every account to be probed", h.describe)
            assert (probed["alpha"].dead_token, probed["first"].dead_token,
                    probed["second"].dead_token) == (True, None, None)

            # first hits its usage limit: depleted until the reset it printed, and the job
            # runs again at once under second (alpha's token is dead), nothing spent.
            reset_first = limit(tmp_path, "first", 60)
            blocked = h.client.submit("agent").job_id
            job = h.wait_status(blocked, JobStatus.DONE, timeout=30)
            assert datetime.now(UTC) < reset_first, "it waited for first's reset"
            assert (account_of(store, blocked, 1), account_of(store, blocked, 2)) == (
                "first", "second")
            assert (job.attempt, job.failures, job.spawn_failures, job.transient_attempts) == (
                2, 0, 0, 0)
            [first] = [r for r in store.account_list(h.host) if r.account.name == "first"]
            assert first.health.depleted_until == reset_first
            assert f"account:{h.host}:first" in alert_keys(store)

            # second hits its limit too, with a later reset: no account can serve the job,
            # so it waits for the earliest reset (first's), nothing spent.
            limit(tmp_path, "second", 3600)
            drained = h.client.submit("agent").job_id
            job = wait_for(lambda: (j := h.job(drained)).failure_reason == "usage_blocked"
                           and j, 60, "second's usage limit to be judged", h.describe)
            assert account_of(store, drained, 1) == "second"
            assert (job.status, job.available_at) == (JobStatus.QUEUED, reset_first)
            assert (job.failures, job.spawn_failures, job.transient_attempts) == (0, 0, 0)
            assert {f"account:{h.host}:first", f"account:{h.host}:second"} <= alert_keys(store)
            why = h.cli("why", str(drained)).stdout
            assert "after usage_blocked" in why and f"{h.host}/alpha dead_token" in why, why
            assert f"{h.host}/first depleted until" in why, why

            # No healthy account: a new job waits for first's reset with nothing spent, and
            # the fleet-stopped alert names the host and each account's state.
            waiting = h.client.submit("agent").job_id
            job = wait_for(lambda: (j := h.job(waiting)).failure_reason
                           == "no_healthy_account" and j, 60, "no healthy account",
                           h.describe)
            assert datetime.now(UTC) < reset_first, "too slow: first's reset already passed"
            assert (job.status, job.available_at) == (JobStatus.QUEUED, reset_first)
            assert (job.failures, job.spawn_failures, job.transient_attempts) == (0, 0, 0)
            assert not [e for e in store.event_list(waiting) if e.kind == "account"]
            [alert] = [a for a in store.alert_list() if a.key == "fleet:stopped"]
            for name in (h.host, "(0 of 3)", "alpha (dead_token", "first (depleted until",
                         "second (depleted until"):
                assert name in alert.message, alert.message
            listed = json.loads(h.cli("accounts", "--json").stdout)
            assert {a["name"]: a["state"] for a in listed} == {
                "alpha": "dead_token", "first": "depleted", "second": "depleted"}
            assert SECRET not in h.cli("accounts").stdout

            # first's reset passes: it is used again, the success clears it and its alert.
            (tmp_path / "limits" / "first").unlink()
            h.wait_status(waiting, JobStatus.DONE, timeout=90)
            assert account_of(store, waiting, 2) == "first"
            assert "account=first" in h.cli("show", str(waiting)).stdout
            h.wait_status(drained, JobStatus.DONE, timeout=60)
            assert account_of(store, drained, 2) == "first"
            [first] = [r for r in store.account_list(h.host) if r.account.name == "first"]
            assert first.health.depleted_until is None and first.sessions == 0
            keys = alert_keys(store)
            assert "fleet:stopped" not in keys and f"account:{h.host}:first" not in keys
            assert f"account:{h.host}:second" in keys  # still depleted
            assert "alpha" not in runs(tmp_path)
        finally:
            up.send_signal(signal.SIGTERM)
            h.wait_exit(up, 30, "herder up")
        # The account's secret reached the job and nothing else.
        for job_id in (blocked, drained, waiting):
            for event in store.event_list(job_id):
                assert SECRET not in json.dumps(dict(event.detail))
            assert SECRET not in h.cli("show", str(job_id), "--json").stdout
        assert SECRET not in h.stderr_of(up)
    finally:
        h.close()


def test_herder_up_claims_no_job_whose_accounts_are_all_busy(tmp_path: Path, sqlite_url: str):
    """A job rotated off a spent account while the only other one is busy waits queued
    for that session to end: `herder up` does not claim it only to end it `refused` (an
    attempt a second), as the server's placement passes such a host over."""
    release = tmp_path / "release"
    holder = tmp_path / "holder"
    holder.write_text(f'#!/bin/sh\necho "$WHO" >> "{tmp_path / "runs"}"\n'
                      f'while [ ! -e "{release}" ]; do sleep 0.1; done\n')
    holder.chmod(0o755)
    h = Harness(tmp_path, sqlite_url, extra_config=job_type(tmp_path) + (
        f'\n[job_types.holder]\ncommand = ["{holder}"]\naccounts = true\n'
        'preflight = false\n'))
    try:
        with open(h.config, "a") as config:
            config.write(f'\n[hosts.{h.host}]\nram_total_gb = 16\ntransport = "local"\n'
                         f'[hosts.{h.host}.accounts.first]\nenv = {{WHO = "first"}}\n'
                         f'[hosts.{h.host}.accounts.second]\nenv = {{WHO = "second"}}\n')
        up = h.up("--concurrency", "2")
        try:
            h.wait_ready(up)
            held = h.client.submit("holder").job_id
            wait_for(lambda: runs(tmp_path) == ["first"], 30, "the holder to run under first",
                     h.describe)
            limit(tmp_path, "second", 3600)
            rotated = h.client.submit("agent").job_id
            # second's limit sends it back at once; first, its only other account, is busy.
            job = wait_for(lambda: (j := h.job(rotated)).attempt == 1 and j.status
                           is JobStatus.QUEUED and j, 30, "the job to be rotated", h.describe)
            assert (job.failures, job.spawn_failures) == (0, 0)
            holds_for(lambda: h.job(rotated).attempt == 1, 3, "the job to stay unclaimed",
                      h.describe)
            release.touch()
            done = h.wait_status(rotated, JobStatus.DONE, timeout=60)
            assert done.attempt == 2 and account_of(h.store, rotated, 2) == "first"
            assert [a.outcome.value for a in h.attempts(rotated) if a.outcome] == [
                "usage_blocked", "ok"]
            h.wait_status(held, JobStatus.DONE, timeout=30)
        finally:
            up.send_signal(signal.SIGTERM)
            h.wait_exit(up, 30, "herder up")
    finally:
        h.close()


@pytest.mark.slow
def test_a_server_rotates_jobs_over_accounts_an_agent_probes(make_fleet, tmp_path: Path,
                                                             store_url: str):
    """Through `herder server` and `herder agent`: accounts added with the CLI, first probed
    by the agent with its quota (so it is ranked first); a usage limit and then a revoked
    login on first each send the job to second at once, nothing spent, and raise first's
    alert; with both accounts limited one after the other the job waits for the earlier
    reset; while every account is depleted a new job is not placed at all (attempt 0), `why`
    and the fleet-stopped alert say so, and it runs under first once an operator clears
    first (the test under `herder up` waits for a reset to pass instead)."""
    fleet = make_fleet(tmp_path, store_url, fleet={"alert_grace": "0s"},
                       extra=job_type(tmp_path))
    fleet.add_hosts({"alpha": ("--ram", "16")})
    probe = tmp_path / "usage-probe"
    usage = ('{"credentials_present": true, "has_refresh_token": true, "access_expired": '
             'false, "usage_percent": 40, "resets_at": "2999-01-01T00:00:00Z"}')
    probe.write_text(f"#!/bin/sh\necho '{usage}'\n")
    probe.chmod(0o755)
    fleet.cli("account", "add", "alpha", "first", "--env", "WHO=first", "--env",
              f"API_KEY={SECRET}", "--probe", str(probe))
    fleet.cli("account", "add", "alpha", "second", "--env", "WHO=second")
    bad = fleet.cli("account", "add", "alpha", "third", "--env", "9X=1", check=False)
    assert bad.returncode == 2 and "--env" in bad.stderr
    assert [r.account.name for r in fleet.store.account_list()] == ["first", "second"]
    fleet.start_server()
    fleet.start_agent("alpha")
    store = fleet.store
    wait_for(lambda: [r for r in store.account_list("alpha") if r.account.name == "first"
                      and r.health.usage.percent == 40.0], 60,
             "the agent's probe of first, with its usage", fleet.describe)
    assert "healthy (usage 40%)" in fleet.cli("accounts").stdout

    # A usage limit on first: the job runs again under second at once, nothing spent.
    limit(tmp_path, "first", 3600)
    blocked = fleet.submit(job_type="agent")
    job = fleet.wait_status(blocked, JobStatus.DONE, timeout=30)
    assert (account_of(store, blocked, 1), account_of(store, blocked, 2)) == (
        "first", "second")
    assert (job.attempt, job.failures, job.spawn_failures, job.transient_attempts) == (
        2, 0, 0, 0)
    assert "account:alpha:first" in alert_keys(store)

    # first is logged in again (its limit too): its alert clears.
    (tmp_path / "limits" / "first").unlink()
    assert "cleared" in fleet.cli("account", "clear", "alpha", "first").stdout
    wait_for(lambda: "account:alpha:first" not in alert_keys(store), 30,
             "first's alert to clear", fleet.describe)

    # A revoked login on first: the job runs under second, no human is asked.
    (tmp_path / "limits" / "first.revoked").write_text("")
    revoked = fleet.submit(job_type="agent")
    job = fleet.wait_status(revoked, JobStatus.DONE, timeout=30)
    assert (account_of(store, revoked, 1), account_of(store, revoked, 2)) == (
        "first", "second")
    assert (job.failures, job.human_action) == (0, False)
    keys = alert_keys(store)
    assert "account:alpha:first" in keys and f"job:{revoked}:human_action" not in keys
    [first] = [r for r in store.account_list("alpha") if r.account.name == "first"]
    assert first.health.auth_revoked_at is not None

    # Both accounts limited, one after the other: the job waits for the earlier reset.
    (tmp_path / "limits" / "first.revoked").unlink()
    fleet.cli("account", "clear", "alpha", "first")
    reset_first = limit(tmp_path, "first", 3600)
    limit(tmp_path, "second", 7200)
    drained = fleet.submit(job_type="agent")
    job = wait_for(lambda: (j := fleet.job(drained)).attempt == 2
                   and j.status is JobStatus.QUEUED and j, 60,
                   "both accounts' usage limits", fleet.describe)
    assert (account_of(store, drained, 1), account_of(store, drained, 2)) == (
        "first", "second")
    assert (job.available_at, job.failure_reason) == (reset_first, "usage_blocked")
    why = fleet.why(drained)
    assert "alpha/first depleted until" in why and "alpha/second depleted until" in why, why
    assert (job.failures, job.spawn_failures, job.transient_attempts) == (0, 0, 0)

    waiting = fleet.submit(job_type="agent")
    [alert] = wait_for(lambda: [a for a in store.alert_list() if a.key == "fleet:stopped"],
                       30, "the fleet-stopped alert", fleet.describe)
    assert "alpha" in alert.message and "first (depleted until" in alert.message, alert.message
    assert "second (depleted until" in alert.message and "(0 of 2)" in alert.message
    assert "no healthy account" in fleet.why(waiting)
    assert fleet.job(waiting).attempt == 0  # nothing spent while it waits

    (tmp_path / "limits" / "first").unlink()
    missing = fleet.cli("account", "clear", "alpha", "nobody", check=False)
    assert missing.returncode == 2 and "no account 'nobody'" in missing.stderr
    assert "cleared" in fleet.cli("account", "clear", "alpha", "first").stdout
    fleet.wait_status(waiting, JobStatus.DONE, timeout=90)
    assert account_of(store, waiting, 1) == "first"
    assert SECRET not in json.dumps(fleet.api("GET", f"/api/v1/jobs/{waiting}").json())
