"""`herder server` serves each of its `local` hosts through a child `herder agent` that
holds no database URL and no operator token, only a host token of its own handed over a
pipe; it restarts the child when it dies and stops it (revoking its token) when the host
goes. Every replica serves them, so a local attempt is rescued by its lease or its
guardian's report, not by a pid that may be another machine's."""

from __future__ import annotations

import os
import secrets
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from msgspec.structs import replace
from support.processes import (
    process_argv,
    process_environment,
    process_ids,
    process_parent,
)
from support.waits import wait_for

from herder.api.app import Access, create_app
from herder.core.model import (
    AttemptToken,
    HostRecord,
    JobSpec,
    JobStatus,
    Outcome,
    Scope,
    TokenRecord,
    Transport,
    WorkerId,
)
from herder.core.settings.loading import Config
from herder.core.settings.sections import Settings
from herder.runtime.coordinator import Coordinator
from herder.runtime.hardening import SECRET_VARIABLES
from herder.runtime.local_child import (
    ChildLaunch,
    LocalChild,
    agent_argv,
    heartbeat_fresh,
    revoke_leftovers,
    token_name,
)
from herder.runtime.loop_health import LoopRegistry
from herder.runtime.maintenance import Rescuer, local_worker_alive, rescue_plan
from herder.runtime.process import process_alive, process_start_time

LOCAL = HostRecord(label="late", ram_total_gb=8, transport=Transport.LOCAL,
                   prime_max_workers=2, night_max_workers=2)


LOCAL_TOML = ('[hosts.lh]\nram_total_gb = 8\ntransport = "local"\n'
              '[hosts.lh.prime]\nmax_workers = 2\n[hosts.lh.night]\nmax_workers = 2\n')
"""Only herder.toml declares a local host; the server stores it as it starts."""


def local_fleet(make_fleet, root: Path, db: str):  # type: ignore[no-untyped-def]
    root.mkdir(parents=True, exist_ok=True)
    return make_fleet(root, db, runtime={"attempt_lease": "20s"}, extra=LOCAL_TOML)


def child_agents(fleet, label: str = "lh") -> list[int]:  # type: ignore[no-untyped-def]
    """Pids of the server's child agents for `label` (not their guardians: those are in
    sessions of their own, forked from the agent)."""
    assert fleet.server is not None
    return [pid for pid in process_ids()
            if process_parent(pid) == fleet.server.pid
            and "agent" in process_argv(pid) and label in process_argv(pid)]


def chain(pid: int, top: int) -> list[int]:
    """`pid` and its ancestors up to `top` (included)."""
    found = [pid]
    while found[-1] != top:
        parent = process_parent(found[-1])
        assert parent not in (None, 0, 1), (found, top)
        found.append(parent)
    return found


def live_child_tokens(fleet) -> list[TokenRecord]:  # type: ignore[no-untyped-def]
    return [t for t in fleet.store.token_list()
            if t.name.startswith("local child lh ") and t.revoked_at is None]


def test_a_local_host_runs_its_jobs_in_a_child_agent_that_holds_no_secret(
        make_fleet, tmp_path, store_url):
    """The server serves its local host through a child `herder agent`: the job's parents
    up to the server hold neither the database URL nor the legacy admin token, in their
    environment or their command line, and the child's token is in neither either."""
    fleet = local_fleet(make_fleet, tmp_path / "fleet", store_url)
    legacy = "L" * 40
    fleet.start_server(env={"HERDER_DB": store_url, "HERDER_API_TOKEN": legacy})
    started, release = tmp_path / "started", tmp_path / "release"
    job_id = fleet.submit(["sh", "-c", f"touch {started}; while [ ! -e {release} ]; "
                                       "do sleep 0.1; done; echo finished"], affinity="lh")
    wait_for(started.exists, 60, "the local job to start", fleet.describe)
    job = wait_for(lambda: fleet.job_processes(job_id), 30, "the job's process")[0]
    server = fleet.server
    assert server is not None
    ancestors = chain(job.pid, server.pid)
    assert len(ancestors) >= 3, ancestors  # the job, the child agent, the server
    assert "HERDER_DB" in process_environment(server.pid)  # the test sees what is there
    [agent_pid] = child_agents(fleet)
    assert agent_pid in ancestors
    [token] = live_child_tokens(fleet)
    assert token.scope is Scope.AGENT and token.host == "lh"
    for pid in ancestors[:-1]:
        environment = process_environment(pid)
        assert not set(SECRET_VARIABLES) & set(environment), (pid, environment)
        text = "\0".join([*environment.values(), *process_argv(pid)])
        assert store_url not in text and legacy not in text and "hdr_" not in text, pid
    release.touch()
    done = wait_for(lambda: (j := fleet.store.job_get(job_id)) and not j.status.active and j,
                    60, "the job to end", fleet.describe)
    assert (done.status, done.host) == (JobStatus.DONE, "lh")
    view = fleet._http.get("/healthz").json()
    assert view["ok"] and "heartbeat:lh" in view["loops"], view
    log = (fleet.root / "server-logs" / str(job_id) / "1.log")
    wait_for(lambda: log.exists() and "finished" in log.read_text(), 30,
             "the child's log to reach the server")
    # Switched to another transport: the child is stopped and its own token revoked.
    since = process_start_time(agent_pid)
    assert since is not None
    # No command switches a local host; another replica started with an edited herder.toml
    # does (hosts are shared through the store), so the store's row changes under this one.
    host = fleet.store.host_get("lh")
    assert host is not None
    assert fleet.store.host_update(replace(host, transport=Transport.AGENT),
                                   datetime.now(UTC))
    wait_for(lambda: not process_alive(agent_pid, since), 60, "the child to stop",
             fleet.describe)
    wait_for(lambda: not live_child_tokens(fleet), 30, "its token to be revoked")


def test_a_killed_child_is_restarted_and_its_attempt_handled_as_an_agents(
        make_fleet, tmp_path, store_url):
    """SIGKILL the child agent: its guardian kills the job and reports it gone (the attempt
    is lost at once and requeued), the server starts another child with a new token and
    revokes the old one; the job runs again there. Removing the host stops the child and
    revokes its token."""
    fleet = local_fleet(make_fleet, tmp_path / "fleet", store_url)
    fleet.start_server()
    marks = tmp_path / "marks"
    marks.mkdir()
    release = tmp_path / "release"
    job_id = fleet.submit(["sh", "-c", f"mktemp -p {marks}; while [ ! -e {release} ]; "
                                       "do sleep 0.1; done"], affinity="lh")
    wait_for(lambda: len(list(marks.iterdir())) == 1, 60, "the job's first run", fleet.describe)
    first = wait_for(lambda: fleet.job_processes(job_id), 30, "the job's process")[0]
    [old_agent] = child_agents(fleet)
    [old_token] = live_child_tokens(fleet)
    os.kill(old_agent, signal.SIGKILL)
    wait_for(lambda: not first.alive(), 30, "the guardian to kill the job", fleet.describe)
    wait_for(lambda: (a := child_agents(fleet)) and a[0] != old_agent, 60,
             "the server to start another child", fleet.describe)
    wait_for(lambda: len(list(marks.iterdir())) == 2, 90, "the job's second run",
             fleet.describe)
    attempts = fleet.store.attempt_list(job_id)
    assert attempts[0].outcome is Outcome.LOST, attempts
    [new_token] = live_child_tokens(fleet)
    assert new_token.id != old_token.id
    revoked = {t.id: t for t in fleet.store.token_list()}
    assert revoked[old_token.id].revoked_at is not None
    release.touch()
    done = wait_for(lambda: (j := fleet.store.job_get(job_id)) and not j.status.active and j,
                    60, "the job to end", fleet.describe)
    assert done.status is JobStatus.DONE
    [agent] = child_agents(fleet)
    since = process_start_time(agent)
    fleet.cli("host", "remove", "lh")
    assert since is not None
    wait_for(lambda: not process_alive(agent, since), 60, "the child to stop", fleet.describe)
    assert not live_child_tokens(fleet)  # `host remove` revokes every token of the host
    view = wait_for(lambda: (v := fleet._http.get("/healthz").json())
                    and "heartbeat:lh" not in v["loops"] and v, 30,
                    "the removed host to leave the health report")
    assert view["ok"], view
    assert fleet.server is not None and fleet.server.poll() is None


def test_a_left_over_token_of_a_dead_server_here_is_revoked(store):
    """A server killed with SIGKILL never revoked its child's token: the next one here
    revokes it; another machine's (a replica's) stays."""
    now = datetime.now(UTC)
    store.host_insert(LOCAL, now)
    dead = store.token_insert(token_name("late", f"here/{dead_pid()}/1"), Scope.AGENT, "h1",
                              now, host="late")
    elsewhere = store.token_insert(token_name("late", f"there/{dead_pid()}/1"), Scope.AGENT,
                                   "h2", now, host="late")
    pid = os.getpid()
    alive = store.token_insert(
        token_name("late", str(WorkerId("here", pid, process_start_time(pid) or 0))),
        Scope.AGENT, "h3", now, host="late")
    assert revoke_leftovers(store, "late", "here", now) == 1
    live = {t.id for t in store.token_list() if t.revoked_at is None}
    assert dead not in live and {elsewhere, alive} <= live


def test_the_api_knows_the_token_it_minted_for_its_local_child(store, tmp_path):
    """A job on the server's machine that fails tokens throttles 127.0.0.1, the address its
    host's agent shares: the token minted for a new child is known-good at once, so the
    child is looked up (and passes) instead of waiting out the throttle."""
    store.host_insert(LOCAL, datetime.now(UTC))
    coordinator = Coordinator(store, Config(Settings(), None), host="here")
    app = create_app(coordinator, Access(failure_limit=1), run_coordinator=False)
    failures = app.state.failures
    failures.failed("127.0.0.1", "a guess")
    pid = os.getpid()
    child = LocalChild(store, "late", url=lambda seconds: None, machine="here",
                       server_worker=str(WorkerId("here", pid, process_start_time(pid) or 0)),
                       log_dir=tmp_path, config_path=None, loops=LoopRegistry(),
                       heartbeat_interval=1.0, lease_seconds=20.0,
                       on_minted=coordinator.local_hosts.on_local_token)
    child._launch("http://127.0.0.1:9")  # a real child agent, with nothing to reach
    try:
        [record] = [t for t in store.token_list() if t.name.startswith("local child late ")]
        minted = [key for key in failures._verified if store.token_get(key) == record]
        assert len(minted) == 1
        assert failures.wait("127.0.0.1", minted[0]) is None
        assert failures.wait("127.0.0.1", "another token") is not None
    finally:
        child._end_child()
    assert store.token_get(minted[0]).revoked_at is not None


def test_the_childs_command_line_names_the_token_fd_not_the_token() -> None:
    launch = ChildLaunch("lh", "http://127.0.0.1:8470", 7, "/logs/agents/lh", "/etc/h.toml", 42)
    argv = agent_argv("/usr/bin/python3", launch)
    assert argv[:5] == ["/usr/bin/python3", "-m", "herder.cli", "--config", "/etc/h.toml"]
    assert argv[argv.index("--token-file") + 1] == "/dev/fd/7"
    assert argv[argv.index("--server") + 1] == "http://127.0.0.1:8470"
    assert argv[argv.index("--parent-pid") + 1] == "42"
    assert "--token" not in argv


def placed(store, worker: str, now: datetime) -> int:  # type: ignore[no-untyped-def]
    """A job placed on `late` and taken by `worker`."""
    [job_id] = [r.job_id for r in store.job_insert([JobSpec(command=("true",))], now)]
    store.job_assign("late", [(job_id, 3.0)], 2, 8.0, now)
    assert store.attempt_set_worker(AttemptToken(job_id, 1), worker, now)
    return job_id


def test_a_replica_leaves_another_machines_local_attempt_to_its_lease(store):
    """Replicas each serve the local hosts, so an attempt may run under another machine's
    server: its pid means nothing here. While its runner heartbeats, no replica rescues it;
    silent past the lease, it is requeued (its processes here, if any, killed first)."""
    now = datetime.now(UTC)
    store.host_insert(LOCAL, now)
    job_id = placed(store, f"late/{dead_pid()}/1", now)  # a runner not on this machine
    shared = Rescuer(store, "late", lease_seconds=60, kill_grace=1.0, max_lost=5, shared=True)
    assert shared.run_once(now + timedelta(seconds=30)) == {
        "orphaned": 0, "stale": 0, "requeued": 0, "failed": 0}
    assert store.job_get(job_id).status is JobStatus.CLAIMED
    assert shared.run_once(now + timedelta(seconds=61)) == {
        "orphaned": 1, "stale": 0, "requeued": 1, "failed": 0}
    assert store.job_get(job_id).status is JobStatus.QUEUED


def test_a_live_local_runner_silent_past_its_lease_loses_its_attempt(store):
    """Shared: even a runner alive here (wedged, its heartbeats failing) loses an attempt
    silent past the lease, which its job's processes here are killed for first."""
    now = datetime.now(UTC)
    store.host_insert(LOCAL, now)
    pid = os.getpid()
    job_id = placed(store, str(WorkerId("late", pid, process_start_time(pid) or 0)), now)
    [rescue] = rescue_plan(store.attempt_list_live(), now + timedelta(seconds=61), 60, "late",
                           local_worker_alive, shared=True)
    assert (rescue.reason, rescue.kill) == ("stale", True)
    shared = Rescuer(store, "late", lease_seconds=60, kill_grace=1.0, max_lost=5, shared=True)
    assert shared.run_once(now + timedelta(seconds=61))["stale"] == 1
    assert store.job_get(job_id).status is JobStatus.QUEUED


def test_up_still_requeues_its_own_orphans_at_once(store):
    """Not shared (`herder up`): a runner of this host that is gone is known at once."""
    now = datetime.now(UTC)
    store.host_insert(LOCAL, now)
    job_id = placed(store, f"late/{dead_pid()}/1", now)
    alone = Rescuer(store, "late", lease_seconds=60, kill_grace=1.0, max_lost=5)
    assert alone.run_once(now + timedelta(seconds=1))["orphaned"] == 1
    assert store.job_get(job_id).status is JobStatus.QUEUED


def dead_pid() -> int:
    """A pid with no process started 1 tick after boot here (a worker is pid and start
    time: even were this pid in use, its start time would differ)."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) - 1


def test_a_tls_server_gives_its_local_hosts_agent_a_plain_loopback_listener(
        make_fleet, tmp_path, sqlite_url):
    """Over TLS the child could not trust the certificate for 127.0.0.1: the server also
    listens on a plain-HTTP loopback port of the kernel's choosing, for its children only
    to know of, and the job runs there."""
    from test_tls import make_certificate

    fleet = local_fleet(make_fleet, tmp_path / "fleet", sqlite_url)
    cert, key = make_certificate(tmp_path)
    server = fleet.start("server", "server", "--listen", f"127.0.0.1:{fleet.port}",
                         "--tls-cert", str(cert), "--tls-key", str(key))
    fleet.server = server
    job_id = int(fleet.cli("submit", "--host", "lh", "--no-check", "--", "echo",
                           "over loopback").stdout)
    done = wait_for(lambda: (j := fleet.store.job_get(job_id)) and j.status.terminal and j,
                    60, "the job to end", fleet.describe)
    assert (done.status, done.host) == (JobStatus.DONE, "lh")
    [agent] = child_agents(fleet)
    argv = process_argv(agent)
    url = argv[argv.index("--server") + 1]
    assert url.startswith("http://127.0.0.1:") and url != f"http://127.0.0.1:{fleet.port}"
    assert f"local hosts' agents reach the API on {url}" in fleet.stderr_of(server)


def test_a_stopping_server_stops_its_child_while_its_api_still_answers(
        make_fleet, tmp_path, store_url):
    """SIGTERM to the server alone: it stops its local host's agent first, which hands its
    running attempt back through the API that still answers (the agent's own report, not
    its guardian's: the job is requeued at once), and the child's token is revoked before
    the server exits (uvicorn ends it by the signal it caught)."""
    fleet = local_fleet(make_fleet, tmp_path / "fleet", store_url)
    server = fleet.start_server()
    started = tmp_path / "started"
    job_id = fleet.submit(["sh", "-c", f"touch {started}; exec sleep 600"], affinity="lh")
    wait_for(started.exists, 60, "the local job to start", fleet.describe)
    [agent] = child_agents(fleet)
    since = process_start_time(agent)
    assert since is not None
    os.kill(server.pid, signal.SIGTERM)
    assert fleet.wait_exit(server, 60, "the server to stop") == -signal.SIGTERM
    assert not process_alive(agent, since)
    assert not fleet.job_processes(job_id)
    job = fleet.store.job_get(job_id)
    assert job is not None and job.status is JobStatus.QUEUED, fleet.describe()
    assert "attempt 1.1 reported: queued" in fleet.stderr_of(server)
    assert not live_child_tokens(fleet)


def test_a_killed_server_takes_its_child_along_and_the_next_revokes_its_token(
        make_fleet, tmp_path, sqlite_url):
    """SIGKILL to the server alone: its child agent dies with it (parent-death signal) and
    the child's guardian kills the job, so nothing runs on with a live token; the next
    server here revokes the dead one's child token and serves the host with a new child."""
    fleet = local_fleet(make_fleet, tmp_path / "fleet", sqlite_url)
    server = fleet.start_server()
    started = tmp_path / "started"
    job_id = fleet.submit(["sh", "-c", f"touch {started}; exec sleep 600"], affinity="lh")
    wait_for(started.exists, 60, "the local job to start", fleet.describe)
    job = wait_for(lambda: fleet.job_processes(job_id), 30, "the job's process")[0]
    [agent] = child_agents(fleet)
    since = process_start_time(agent)
    assert since is not None
    [old_token] = live_child_tokens(fleet)
    os.kill(server.pid, signal.SIGKILL)
    server.wait(30)
    wait_for(lambda: not process_alive(agent, since), 30, "the child to die with the server")
    wait_for(lambda: not job.alive(), 30, "its guardian to kill the job", fleet.describe)
    fleet.start_server()
    # The leftover is revoked before the new child's token is minted.
    [new_token] = wait_for(lambda: live_child_tokens(fleet) != [old_token]
                           and live_child_tokens(fleet), 30, "the new server's child token",
                           fleet.describe)
    assert new_token.id != old_token.id


@pytest.mark.postgres
def test_each_replica_serves_the_local_host_with_a_child_and_token_of_its_own(
        make_fleet, tmp_path, postgres_url):
    """Two servers over one PostgreSQL: each starts its own child for the local host, with
    a token named after its own server process; a job runs through one of them."""
    first = local_fleet(make_fleet, tmp_path / "a", postgres_url)
    (tmp_path / "b").mkdir()
    second = make_fleet(tmp_path / "b", postgres_url, runtime={"attempt_lease": "20s"})
    first.start_server()
    second.start_server()
    children = wait_for(lambda: (found := [child_agents(first), child_agents(second)])
                        and all(len(pids) == 1 for pids in found) and found, 60,
                        "a child under each server", first.describe)
    assert children[0] != children[1]
    tokens = wait_for(lambda: len(t := live_child_tokens(first)) == 2 and t, 30,
                      "a token per child")
    servers = {first.server.pid, second.server.pid}  # type: ignore[union-attr]
    assert {int(t.name.split("/")[-2]) for t in tokens} == servers
    job_id = first.submit(["true"], affinity="lh")
    done = wait_for(lambda: (j := first.store.job_get(job_id)) and j.status.terminal and j,
                    60, "the job to end", first.describe)
    assert (done.status, done.host) == (JobStatus.DONE, "lh")


def test_a_heartbeat_is_fresh_within_its_window_only() -> None:
    now = datetime.now(UTC)
    beat = replace(LOCAL, last_heartbeat=now - timedelta(seconds=2))
    assert heartbeat_fresh(beat, now, 3.0)
    assert not heartbeat_fresh(beat, now, 2.0)
    assert not heartbeat_fresh(LOCAL, now, 3.0)  # never heartbeated
    assert not heartbeat_fresh(None, now, 3.0)  # removed


def test_a_child_whose_token_is_revoked_is_replaced(make_fleet, tmp_path, sqlite_url):
    """`herder host token lh` revokes every token of the host, the child's too: refused, it
    sends no heartbeat, and the server replaces it (new token) within a lease."""
    fleet = local_fleet(make_fleet, tmp_path / "fleet", sqlite_url)
    fleet.start_server()
    [old_token] = wait_for(lambda: live_child_tokens(fleet), 30, "the child's token")
    [old_agent] = wait_for(lambda: child_agents(fleet), 30, "the child")
    fleet.cli("host", "token", "lh")
    [new_token] = wait_for(lambda: live_child_tokens(fleet), 90, "a new child's token",
                           fleet.describe)
    assert new_token.id != old_token.id
    assert child_agents(fleet) != [old_agent]
    job_id = fleet.submit(["true"], affinity="lh")
    done = wait_for(lambda: (j := fleet.store.job_get(job_id)) and j.status.terminal and j,
                    60, "the job to end", fleet.describe)
    assert done.status is JobStatus.DONE


def test_a_local_hosts_child_agent_runs_the_preflight_and_the_job_waits_for_it(
        make_fleet, tmp_path, sqlite_url):
    """Seed 002's preflight on a server's local host: its child agent runs it (cached for
    the type's `preflight_cache`); while it fails the job stays queued, nothing spent,
    and `why` says so; once it passes, the job runs there."""
    tool = tmp_path / "tools" / "agentcli"
    root = tmp_path / "fleet"
    root.mkdir()
    fleet = make_fleet(root, sqlite_url, runtime={"attempt_lease": "20s"}, extra=(
        LOCAL_TOML + f'[job_types.agentic]\ncommand = ["{tool}", "work"]\n'
        'preflight_cache = "1s"\n'))
    fleet.start_server()

    def failed() -> dict[str, str]:
        host = fleet.store.host_get("lh")
        found = (host.agent_info if host is not None else {}).get("preflight_failed")
        return found if isinstance(found, dict) else {}

    wait_for(lambda: "agentic" in failed(), 60, "the child's failed preflight", fleet.describe)
    job_id = fleet.submit(job_type="agentic")
    why = wait_for(lambda: "lh preflight failed" in (text := fleet.why(job_id)) and text, 30,
                   "why to name the preflight", fleet.describe)
    assert str(tool) in why, why
    job = fleet.job(job_id)
    assert (job.status, job.attempt, job.failures) == (JobStatus.QUEUED, 0, 0), job
    tool.parent.mkdir()
    tool.write_text('#!/bin/sh\necho "agentcli ran on $HERDER_HOST"\n')
    tool.chmod(0o755)
    done = fleet.wait_status(job_id, JobStatus.DONE)
    assert (done.host, done.attempt, done.failures) == ("lh", 1, 0), done


def test_a_killed_child_is_restarted_and_adopts_its_predecessors_job(
        make_fleet, tmp_path, sqlite_url):
    """With adopt_grace, a local host's child agent killed with -9 leaves its job running:
    the server starts another child, which adopts it (same process, one attempt)."""
    label = f"lh{secrets.token_hex(3)}"  # no other test's agent kills its survivors
    root = tmp_path / "fleet"
    root.mkdir()
    fleet = make_fleet(root, sqlite_url, runtime={"attempt_lease": "20s",
                                                  "adopt_grace": "60s",
                                                  "memory_enforcement": "watchdog"},
                       extra=LOCAL_TOML.replace("hosts.lh", f"hosts.{label}"))
    fleet.start_server()
    started, release = tmp_path / "started", tmp_path / "release"
    job_id = fleet.submit(["sh", "-c", f"touch {started}; while [ ! -e {release} ]; "
                                       "do sleep 0.1; done"], affinity=label)
    wait_for(started.exists, 60, "the local job to start", fleet.describe)
    job = wait_for(lambda: fleet.job_processes(job_id), 30, "the job's process")[0]
    [old_agent] = child_agents(fleet, label)
    os.kill(old_agent, signal.SIGKILL)
    wait_for(lambda: (a := child_agents(fleet, label)) and a[0] != old_agent, 60,
             "the server to start another child", fleet.describe)
    wait_for(lambda: fleet.store.attempt_list(job_id)[0].worker.split("/")[1]
             not in ("", str(old_agent)), 60, "the new child to adopt the job", fleet.describe)
    assert job.alive()
    release.touch()
    done = wait_for(lambda: (j := fleet.store.job_get(job_id)) and not j.status.active and j,
                    60, "the job to end", fleet.describe)
    assert (done.status, done.attempt, done.lost) == (JobStatus.DONE, 1, 0)
