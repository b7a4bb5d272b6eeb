"""Self-fencing: a runner that cannot renew its attempts' lease stops them before it ends.

The server (or, for `herder up`, any rescuer on the store) declares an attempt lost only
after a whole lease without an accepted heartbeat, and may then run the job elsewhere. The
runner counts each lease from when it *sent* the heartbeat that renewed it, and stops the
attempt (SIGTERM, SIGKILL of the whole tree) `fence_margin` before that lease ends, so two
attempts of a job never overlap, even when the network is cut.

Pure tests of the decision, then real runners and real process trees: an agent's
`HttpSource` whose network is cut (`httpx.MockTransport` playing the server), and a
store-backed runner whose store stops answering. The tests record monotonic times and
assert the order of events (the tree is gone before the lease runs out), not durations.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.local import Harness, shell
from support.processes import marked_processes
from support.waits import wait_for
from test_runner_faults import RunnerThread

from herder.core.errors import ConfigError
from herder.core.model import AttemptToken, JobStatus, Outcome
from herder.core.settings.loading import load_config
from herder.core.settings.sections import RuntimeSection
from herder.runtime.agent import HttpSource, ServerClient
from herder.runtime.fence import fence_due, fence_kill_at, fence_margin
from herder.runtime.local_gate import LocalGate
from herder.runtime.runner import Runner
from herder.runtime.runner_options import RunnerOptions
from herder.wire.agents import HeartbeatReply, HostGate, pairs

# -- the decision (pure) ------------------------------------------------------------------------


def test_fence_margin_defaults_to_a_quarter_of_the_lease():
    assert fence_margin(60.0, None) == 15.0
    assert fence_margin(60.0, 10.0) == 10.0
    # A server lease shorter than the configured margin: the margin would swallow it.
    assert fence_margin(8.0, 10.0) == 2.0


def test_fence_is_due_at_lease_minus_margin_from_the_renewal():
    assert not fence_due(renewed=100.0, now=144.9, lease=60.0, margin=15.0)
    assert fence_due(renewed=100.0, now=145.0, lease=60.0, margin=15.0)


def test_a_fenced_tree_is_killed_before_the_lease_ends():
    assert fence_kill_at(now=145.0, lease_end=160.0, kill_grace=10.0) == 155.0
    # A grace longer than what is left: three quarters of the rest of the lease.
    assert fence_kill_at(now=145.0, lease_end=160.0, kill_grace=30.0) == 156.25
    # The runner was held up past the lease: at once.
    assert fence_kill_at(now=161.0, lease_end=160.0, kill_grace=10.0) == 161.0
    for now in (0.0, 10.0, 44.0, 59.9):
        for grace in (0.0, 1.0, 10.0, 100.0):
            assert now <= fence_kill_at(now, 60.0, grace) < 60.0


@pytest.mark.parametrize(("margin", "message"), [
    ('"60s"', r":3: runtime\.fence_margin: fence_margin \(60s\) must be shorter than "
              r"attempt_lease \(60s\) \(lower runtime\.fence_margin"),
    ("0", r":3: runtime\.fence_margin: must be greater than zero"),
])
def test_fence_margin_must_fit_inside_the_lease(tmp_path: Path, margin: str, message: str):
    path = tmp_path / "herder.toml"
    path.write_text(f'[runtime]\nattempt_lease = "60s"\nfence_margin = {margin}\n')
    with pytest.raises(ConfigError, match=message):
        load_config(path)


# -- an agent cut off from its server -----------------------------------------------------------

SERVER_LEASE = 6.0
"""What the mock server says its lease is; the agent's own config says 60 s, so only the
server's value can make the fence come in time."""


def assignment_view(job_id: int, attempt: int, command: list[str], workdir: str,
                    **overrides: Any) -> dict[str, Any]:
    """An assignment as the server's `/assignments` sends it."""
    stamp = datetime.now(UTC).isoformat()
    return {
        "id": job_id, "attempt": attempt, "job_type": "adhoc", "command": command,
        "shell": False, "payload": {}, "priority": 100, "weight": "light", "ram_gb": 0.0,
        "env": {}, "workdir": workdir, "timeout_seconds": None, "max_attempts": 3,
        "failures": 0, "lost": 0, "spawn_failures": 0, "backoff_base_seconds": 10.0,
        "backoff_max_seconds": 600.0, "available_at": stamp, "created_at": stamp,
        "updated_at": stamp, **overrides,
    }


class CuttableServer:
    """Plays `herder server` for one agent through httpx.MockTransport: hands out one
    attempt, answers heartbeats (recording when it accepted each one and what it named),
    records reports; while `cut`, every request fails as a dead network does."""

    def __init__(self, label: str, view: dict[str, Any]) -> None:
        self.label = label
        self.view = view
        self.cut = False
        self.lock = threading.Lock()
        self.accepted: list[tuple[float, set[AttemptToken]]] = []
        self.reports: list[tuple[str, AttemptToken, dict[str, Any]]] = []
        self.handed_out = False
        self.closing = threading.Event()

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.cut:
            raise httpx.ConnectError("network cut (injected)", request=request)
        tail = request.url.path.split(f"/api/v1/agent/{self.label}", 1)[1]
        if tail == "/heartbeat":
            body = json.loads(request.content)
            running = {AttemptToken(job, attempt) for job, attempt in body["running"]}
            with self.lock:
                self.accepted.append((time.monotonic(), running))
                ended = {token for kind, token, _ in self.reports if kind == "finish"}
            gate = HostGate(label=self.label, enabled=True, window="prime", max_workers=1,
                            max_weight=None, allowed_job_types=None, allowed_weights=None,
                            priority_floor=None, weights={"light": 3.0}, escalation=["light"])
            reply = HeartbeatReply(live=pairs(running - ended), cancel=[], host=gate,
                                   lease_seconds=SERVER_LEASE)
            return httpx.Response(200, json=reply.model_dump(mode="json"))
        if tail == "/assignments":
            with self.lock:
                jobs = [] if self.handed_out else [self.view]
                self.handed_out = True
            if not jobs:  # a long-poll with nothing to give
                self.closing.wait(min(float(request.url.params.get("wait", "1")), 0.5))
            return httpx.Response(200, json={"jobs": jobs})
        if tail == "/cancels":
            return httpx.Response(200, json={"cancel": []})
        _, _, job_id, attempt, kind = tail.split("/")
        if kind == "log":
            return httpx.Response(200, json={"size": 0})
        body = json.loads(request.content) if request.content else {}
        with self.lock:
            self.reports.append((kind, AttemptToken(int(job_id), int(attempt)), body))
        return httpx.Response(200, json={"accepted": True, "status": "queued"})

    def last_accepted(self, token: AttemptToken) -> float | None:
        with self.lock:
            times = [at for at, running in self.accepted if token in running]
        return max(times) if times else None

    def report(self, kind: str, token: AttemptToken) -> dict[str, Any] | None:
        with self.lock:
            found = [body for k, t, body in self.reports if (k, t) == (kind, token)]
        return found[0] if found else None


def test_an_agent_cut_off_kills_its_tree_before_the_lease_ends(tmp_path: Path):
    label = f"fence{secrets.token_hex(4)}"
    token = AttemptToken(41, 1)
    view = assignment_view(token.job_id, token.attempt,
                           ["/bin/sh", "-c", "sleep 300 & sleep 300 & wait"], str(tmp_path))
    server = CuttableServer(label, view)
    client = ServerClient("http://coordinator.invalid", "hdr_test", label,
                          allow_plaintext=True)  # a mock transport: no network
    client.http.close()
    client.http = httpx.Client(base_url="http://coordinator.invalid",
                               transport=httpx.MockTransport(server.handle))
    source = HttpSource(client, LocalGate(), concurrency=1, heartbeat_interval=0.2,
                        long_poll=1.0, check_ram=False, kill_grace=0.5)
    options = RunnerOptions(host=label, log_dir=tmp_path / "logs", runtime=RuntimeSection(
        concurrency=1, heartbeat_interval=0.2, attempt_lease=60.0, kill_grace=0.5,
        poll_interval=0.2, fence_margin=3.0))
    runner = Runner(None, options, source=source)
    source.in_flight = lambda: len(runner.running)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            runner.run(install_signals=False)
        except BaseException as exc:
            errors.append(exc)

    def tree() -> list[Any]:
        return marked_processes(lambda marker: marker.startswith(f"{token}@{label}/"))

    def state() -> str:
        return (f"reports={server.reports}\naccepted={server.accepted[-3:]}\n"
                f"processes={tree()}\nrunning={list(runner.running)}")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        procs = wait_for(lambda: len(found := tree()) == 3 and found, 20,
                         "the attempt's tree (shell and two sleeps)", state)
        wait_for(lambda: server.report("start", token), 10, "the start report", state)
        wait_for(lambda: server.last_accepted(token), 10, "a heartbeat naming the attempt",
                 state)

        server.cut = True
        cut = time.monotonic()
        assert all(p.alive() for p in procs), "the tree died before the cut"
        wait_for(lambda: not any(p.alive() for p in procs), 30,
                 "the agent to kill its tree while cut off", state)
        dead = time.monotonic()
        last = server.last_accepted(token)
        assert last is not None and last < cut
        # The server would declare the attempt lost a whole lease after the last heartbeat
        # it accepted, at the earliest; the tree was gone (and observed so) before that.
        assert dead < last + SERVER_LEASE, (
            f"tree gone {dead - last:.2f}s after the last accepted heartbeat, "
            f"lease {SERVER_LEASE}s")
        assert server.report("finish", token) is None
        log = tmp_path / "logs" / str(token.job_id) / "1.log"
        # The runner notes the fence in the log once the kill is done, which may be a moment
        # after the tree is seen gone.
        wait_for(lambda: "lease not renewed" in log.read_text(), 10,
                 "the fence's note in the attempt's log", log.read_text)

        server.cut = False
        finish = wait_for(lambda: server.report("finish", token), 20,
                          "the agent to report the attempt once it reaches the server", state)
        assert finish["outcome"] == str(Outcome.LOST), finish
    finally:
        server.cut = False
        server.closing.set()
        runner.request_shutdown()
        runner.request_shutdown()
        thread.join(timeout=40)
    assert not thread.is_alive() and not errors, errors
    assert tree() == []


# -- `herder up` whose store stops answering ----------------------------------------------------

OUTAGE = {"take", "started", "heartbeat", "finished", "cancel_requested", "maintain"}


def test_a_runner_cut_off_from_its_store_kills_its_tree_before_the_lease_ends(
    harness: Harness,
):
    h = harness
    lease = 6.0
    job_id = h.submit(shell('if [ "$HERDER_ATTEMPT" = 1 ]; then sleep 300 & sleep 300 & wait; '
                            'fi; echo second'))
    runner = RunnerThread(h, attempt_lease=lease, fence_margin=3.0, kill_grace=0.5)
    token = AttemptToken(job_id, 1)
    try:
        procs = wait_for(lambda: len(found := h.marked(job_id, 1)) == 3 and found, 20,
                         "attempt 1's tree", h.describe)
        wait_for(lambda: runner.source.renewed.get(token), 10, "a heartbeat of attempt 1",
                 h.describe)

        runner.source.failing.update(OUTAGE)
        cut = time.monotonic()
        assert all(p.alive() for p in procs), "the tree died before the outage"
        wait_for(lambda: not any(p.alive() for p in procs), 30,
                 "the runner to kill its tree while the store is out", h.describe)
        dead = time.monotonic()
        last = runner.source.renewed[token]
        assert last < cut
        # Any rescuer declares the attempt lost a lease after the heartbeat the store
        # recorded last (stamped no earlier than `last`): the tree was gone before.
        assert dead < last + lease, f"tree gone {dead - last:.2f}s after the last renewal"
        job = h.job(job_id)
        assert (job.status, job.attempt) == (JobStatus.RUNNING, 1), job

        runner.source.failing.clear()
        job = h.wait_status(job_id, JobStatus.DONE)
        assert job.attempt == 2, job
    finally:
        runner.stop()
    assert [a.outcome for a in h.attempts(job_id)] == [Outcome.LOST, Outcome.OK]
    assert "lease not renewed" in (h.log_dir / str(job_id) / "1.log").read_text()
    assert h.marked() == []
