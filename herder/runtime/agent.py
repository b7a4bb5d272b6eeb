"""`herder agent`: runs a host's jobs, talking to the server over outbound HTTP(S) only.

The agent is the same runner loop as `herder up` with an HTTP work source. Assignments come
from a long-poll (an idle agent waits on an open request, so a placed job starts within
milliseconds); results (start, finish) go through an outbox with one ordered lane per
attempt that retries until the server answers, so a server restart loses nothing and the
agent keeps its running jobs, while logs stream apart from them, best effort and bounded.
The agent gates itself before asking for work and re-checks each assignment against its own
local allow-lists, refusing (fail-closed) what violates them; it checks real free RAM before
spawning and hands a job back when the host is short.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from herder.core.model import AttemptToken, HeartbeatReply, Job, JobStatus, Outcome, WorkerId
from herder.core.settings.sections import DEFAULTS
from herder.runtime.accounts import ProbeCommand, Prober
from herder.runtime.agent_client import (
    ReportGone,
    RequestRefused,
    ServerClient,
    ServerError,
    ServerUnavailable,
)
from herder.runtime.attempt_files import agent_path_for, launch_path_for, log_path_for
from herder.runtime.endings import Ending
from herder.runtime.guardian import handover_path, lost_path, touch
from herder.runtime.local_gate import RAM_FACTOR, LocalGate, mem_available_gb
from herder.runtime.log_shipper import FINAL_LOG_WAIT, LOG_BACKLOG, LogShipper
from herder.runtime.maintenance import local_worker_alive
from herder.runtime.outbox import Outbox, Report
from herder.runtime.preflight import Check, Preflight
from herder.runtime.process import kill_tree, process_log, token_markers, tree_alive
from herder.runtime.sources import WorkSource
from herder.store import Waker
from herder.wire import agents as protocol
from herder.wire.agents import FinishBody, StartBody, storable_text

log = logging.getLogger("herder.agent")


class _Event(Waker):
    def __init__(self, event: threading.Event) -> None:
        self._event = event

    def wait(self, timeout: float) -> bool:
        woke = self._event.wait(timeout)
        self._event.clear()
        return woke

    def close(self) -> None:
        pass


class HttpSource(WorkSource):
    def __init__(
        self,
        client: ServerClient,
        gate: LocalGate,
        concurrency: int,
        heartbeat_interval: float = DEFAULTS.runtime.heartbeat_interval,
        long_poll: float = DEFAULTS.server.long_poll,
        check_ram: bool = True,
        kill_grace: float = DEFAULTS.runtime.kill_grace,
        poll: bool = True,
        close_timeout: float = 30.0,
        log_backlog: int = LOG_BACKLOG,
        log_interval: float = 1.0,
        preflight: Preflight | None = None,
    ) -> None:
        self.client = client
        self.preflight = preflight or Preflight()
        self.prober = Prober(self.preflight.pass_env)
        # Retry no slower than the heartbeat: after an outage the server must hear from this
        # agent (and get its queued reports) within one lease, or it declares them lost.
        client.max_delay = min(client.max_delay, max(heartbeat_interval, 0.2))
        self.label = client.label
        self.gate = gate
        self.concurrency = concurrency
        self.heartbeat_interval = heartbeat_interval
        # Heartbeats and cancel checks run on the runner's thread: a server that swallows
        # packets must not stall supervision (timeouts, kills, the fence) for long.
        self.runner_timeout = max(1.0, min(10.0, heartbeat_interval / 2))
        self.long_poll = long_poll
        self.check_ram = check_ram
        self.kill_grace = kill_grace
        self.poll = poll
        self.handed_back: Outcome | None = None
        self.in_flight: Callable[[], int] = lambda: 0
        self.draining = threading.Event()
        self.server_gate: protocol.HostGate | None = None
        self.host_attempts: list[tuple[AttemptToken, str]] = []
        self.stopped = False
        self.close_timeout = close_timeout
        self._closed = False
        self._inbox: queue.Queue[Job] = queue.Queue()
        # Written by the outbox's and the poll thread, read by the runner's: set and dict
        # operations are atomic.
        self._gone: set[AttemptToken] = set()
        self._asked: dict[AttemptToken, float] = {}
        self._outbox = Outbox(client, self._log_hold, gone=self._gone.add)
        self._logs = LogShipper(client, log_backlog, interval=log_interval,
                                on_settled=self._outbox.wake)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._cancels: set[AttemptToken] = set()
        self._next_cancel_check = 0.0
        self._adopted: set[AttemptToken] = set()
        self.handover: Path | None = None
        """The folder of handover files (herder.runtime.guardian) in the agent's log
        folder: set for an agent whose guardian waits for a successor. Survivors of dead
        agents are then only the ones whose log is in that log folder: another herder on
        this machine may run a host of the same label (its own database, a test)."""

    # -- lifecycle --------------------------------------------------------------------------

    def attach(self, worker: str) -> None:
        super().attach(worker)
        # The first heartbeat also fetches the host's live attempts, for `maintain` to hand
        # back what a dead predecessor of this agent was running.
        self._host_heartbeat(retry=True, with_attempts=True)
        self._outbox.start()
        loops = [(self._ship_loop, "herder-agent-logs")]
        if self.poll:
            loops.append((self._poll_loop, "herder-agent-poll"))
        for target, name in loops:
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def close(self) -> None:
        """Deliver what is queued (for `close_timeout` at most), then say goodbye."""
        if self._closed:
            return
        self._closed = True
        self.stopped = True
        deadline = time.monotonic() + self.close_timeout
        left = self._outbox.flush(deadline)
        while self._logs.unsettled() and time.monotonic() < deadline:
            self._stop.wait(0.05)
        if left:
            log.error("%d report(s) not delivered before shutdown (%s); the server will "
                      "declare those attempts lost after the lease", len(left),
                      ", ".join(f"{r.token} {r.kind}" for r in left))
        # Last word: this host takes no work until an agent heartbeats for it again.
        with contextlib.suppress(ServerError):
            self._heartbeat_call([], retry=False)
        self._stop.set()
        self._outbox.stop()
        for thread in self._threads:
            thread.join(1.0)
        self.client.close()

    # -- the runner's side --------------------------------------------------------------------

    def take(self, free: int, now: datetime) -> list[Job]:
        jobs: list[Job] = []
        while len(jobs) < free:
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                break
            if self.admit(job):
                jobs.append(job)
            else:
                self._asked.pop(job.token, None)  # handed back: the runner never asks
        return jobs

    def admit(self, job: Job) -> bool:
        """The agent's own checks before spawning; a refused job is handed back."""
        refusal = self.gate.refusal(job)
        failed = self.preflight.failed().get(job.job_type)
        if refusal is None and failed is not None:
            refusal = f"preflight for job type {job.job_type} failed: {failed}"
        if refusal is not None:
            log.warning("job %d refused: %s", job.id, refusal)
            self.handed_back = Outcome.REFUSED
            self._report(job.token, "finish", FinishBody(outcome=Outcome.REFUSED,
                                                         retry_after=0, detail=refusal))
            return False
        if self.check_ram and job.ram_gb > 0:
            available = mem_available_gb()
            if available is not None and available < job.ram_gb * RAM_FACTOR:
                log.warning("job %d handed back: needs %.1f GB x %.1f, %.1f GB available",
                            job.id, job.ram_gb, RAM_FACTOR, available)
                self.handed_back = Outcome.RAM_CONTENTION
                self._report(job.token, "finish", FinishBody(
                    outcome=Outcome.RAM_CONTENTION, detail=f"{available:.1f} GB free"))
                return False
        return True


    def started(self, token: AttemptToken, pid: int, log_path: str, now: datetime) -> bool:
        self._logs.add(token, Path(log_path))
        self._report(token, "start", StartBody(pid=pid, log_path=log_path))
        return True

    def heartbeat(self, tokens: Sequence[AttemptToken], now: datetime) -> HeartbeatReply:
        # A failure raises: nothing was renewed, and the runner stops the attempts before
        # their lease ends if the server stays out of reach (self-fencing).
        reply = self._heartbeat_call(tokens, retry=False)
        # An attempt whose start report is still in the outbox is not live on the server yet.
        pending = frozenset(t for t in tokens if self._pending_start(t))
        return HeartbeatReply(protocol.tokens(reply.live) | pending, protocol.tokens(reply.cancel))

    def finished(self, job: Job, outcome: Outcome, exit_code: int | None, now: datetime,
                 retry_after: float | None = None, ending: Ending | None = None
                 ) -> JobStatus | None:
        # Both from threads of their own: a retry here would stop all supervision (timeouts,
        # reaping, heartbeats, drain) for as long as the server is unreachable. The finish
        # waits for the last log chunks only while they go through (see `_log_hold`).
        # The server judges the ending: it knows the job type's exit codes and the weights.
        self._logs.finish(job.token)
        fields: dict[str, Any] = {"outcome": outcome, "exit_code": exit_code,
                                  "retry_after": retry_after}
        if ending is not None and ending.launch_error:
            # In `detail`, which every server accepts (and older ones ignore): a new field
            # would be refused with 422 by them, and the finish dropped.
            fields["detail"] = storable_text(ending.launch_error)
        elif ending is not None:  # the fields only when there is an ending to judge
            fields["log_tail"] = storable_text(ending.log_tail)
            if ending.result is not None:
                fields["result"] = storable_text(ending.result)
            fields.update(FinishBody.memory_fields(ending.memory))
        self._report(job.token, "finish", FinishBody(**fields))
        return None

    def learn_lease(self, seconds: float | None) -> None:
        """The lease the server enforces, from any reply that says it."""
        if seconds is not None and seconds > 0:
            self.lease_seconds = seconds

    def asked_at(self, token: AttemptToken) -> float | None:
        return self._asked.pop(token, None)

    def fenced_out(self) -> set[AttemptToken]:
        gone = set(self._gone)
        self._gone.difference_update(gone)
        return gone

    def cancel_requested(self, job_ids: Sequence[int]) -> set[AttemptToken]:
        now = time.monotonic()
        if now >= self._next_cancel_check and job_ids:
            self._next_cancel_check = now + 0.5
            try:
                reply = protocol.Cancels.model_validate(self.client.call(
                    "GET", "/cancels", retry=False, params={"jobs": ",".join(map(str, job_ids))},
                    timeout=self.runner_timeout))
                self._cancels = set(protocol.tokens(reply.cancel))
            except ServerError:
                pass
        return set(self._cancels)

    def idle(self) -> bool:
        return False

    def drain(self) -> None:
        self.draining.set()

    def waker(self) -> Waker:
        return _Event(self._wake)

    supervised = True

    def predecessors(self) -> list[tuple[AttemptToken, str]]:
        """The host's live attempts (as the first heartbeat listed them) of dead agents of
        this host: what a restarted agent adopts."""
        found = []
        for token, worker_text in self.host_attempts:
            worker = WorkerId.parse(worker_text)
            if (worker is not None and worker.host == self.label
                    and worker_text != self.worker and not local_worker_alive(worker)
                    and not (self.handover is not None
                             and lost_path(self.handover, worker).exists())):
                found.append((token, worker_text))
        return found

    def adopt(self, token: AttemptToken, previous: str, log_path: str) -> bool:
        try:
            reply = protocol.Adopted.model_validate(self.client.call(
                "POST", f"/attempts/{token.job_id}/{token.attempt}/adopt", retry=False,
                timeout=self.runner_timeout,
                json=protocol.AdoptBody(worker=self.worker, previous=previous).model_dump()))
        except (ReportGone, RequestRefused) as exc:
            log.warning("attempt %s of dead agent %s cannot be adopted (%s): killing it",
                        token, previous, exc)
            return False
        self._adopted.add(token)
        self._logs.add(token, Path(log_path), offset=reply.log_size)
        return True

    def maintain(self, now: datetime) -> None:
        """Kill what a previous agent of this host left running and this one did not adopt,
        and report it lost.

        Survivors are found by their markers (the guardian normally got there first); the
        server's list of this host's live attempts names the rest, so a restarted agent
        hands them back at once instead of after the lease. A placement a dead agent took
        and never started is run here instead (`_take_over`)."""
        reported: set[AttemptToken] = set(self._adopted)
        dead: set[WorkerId] = set()
        for marker, pids in token_markers().items():
            token, worker = parse_marker(marker)
            if token is None or worker is None or worker.host != self.label:
                continue
            if (str(worker) == self.worker or local_worker_alive(worker)
                    or token in self._adopted or not self._ours(pids)):
                continue
            dead.add(worker)
            log.warning("attempt %s survived a dead agent (pids %s): killing it", token, pids)
            if kill_tree(None, marker, self.kill_grace):
                self._report(token, "finish", FinishBody(outcome=Outcome.LOST))
                reported.add(token)
        for token, worker_text in self.host_attempts:
            worker = WorkerId.parse(worker_text)
            if (worker is None or worker.host != self.label
                    or worker_text == self.worker or local_worker_alive(worker)):
                continue
            dead.add(worker)
            if token in reported:
                continue
            marker = f"{token}@{worker_text}"
            ran = tree_alive(None, marker)
            if kill_tree(None, marker, self.kill_grace):
                if not ran and self._take_over(token, worker_text):
                    reported.add(token)
                    continue
                log.warning("attempt %s belonged to a dead agent of this host: reporting it "
                            "lost", token)
                self._report(token, "finish", FinishBody(outcome=Outcome.LOST))
                reported.add(token)
        self.host_attempts = [(t, w) for t, w in self.host_attempts if t not in reported]
        if self.handover is not None:
            # The dead agents' guardians may be waiting on this: their attempts are this
            # agent's now, or killed and reported.
            for worker in dead:
                touch(handover_path(self.handover, worker))
                agent_path_for(self.handover, worker).unlink(missing_ok=True)

    def _take_over(self, token: AttemptToken, previous: str) -> bool:
        """Run here a placement a dead agent of this host took and never launched: the
        dead agent noted itself in this log folder (`note_agent`; else its notes are
        elsewhere, and this agent cannot tell), no launch note of it (`note_launch`,
        written before anything of it starts), no log of it in this log folder, no process
        of it found, and nothing of its log on the server. The attempt becomes this agent's
        as an adoption does (the server fences it: only while still live and `previous`'s)
        and runs under the same number: it never ran, so nothing is spent. False when it
        cannot be (it is reported lost instead: it may have run, and its side effects must
        not happen twice)."""
        worker = WorkerId.parse(previous)
        if (self.handover is None or worker is None
                or not agent_path_for(self.handover, worker).exists()
                or launch_path_for(self.handover, token, worker).exists()
                or log_path_for(self.handover.parent, token).exists()):
            return False
        path = f"/attempts/{token.job_id}/{token.attempt}"
        asked = time.monotonic()
        try:
            # Placed and not started (else None); only a dead agent could start it since.
            placed = protocol.PlacedAttempt.model_validate(self.client.call(
                "GET", path, retry=False, timeout=self.runner_timeout))
            if placed.job is None:
                return False
            adopted = protocol.Adopted.model_validate(self.client.call(
                "POST", f"{path}/adopt", retry=False, timeout=self.runner_timeout,
                json=protocol.AdoptBody(worker=self.worker, previous=previous).model_dump()))
        except (ReportGone, RequestRefused):
            return False
        if adopted.log_size > 0:
            # It printed, so it ran (under another log folder, or its start report was
            # lost): this agent holds it now, and reports it lost.
            log.warning("job %d attempt %d: taken by dead agent %s, which left %d bytes of "
                        "log on the server: not running it again", token.job_id,
                        token.attempt, previous, adopted.log_size)
            return False
        self._adopted.add(token)
        self._asked[token] = asked
        self._inbox.put(placed.job.job(datetime.now().astimezone()))
        self._wake.set()
        log.warning("job %d attempt %d: taken by dead agent %s, which never started it; "
                    "running it here", token.job_id, token.attempt, previous)
        return True

    def _ours(self, pids: Sequence[int]) -> bool:
        """False only when the processes name a job log outside this agent's log folder
        (one that cleared its environment is taken for this agent's, and killed)."""
        if self.handover is None:
            return True
        folder = str(self.handover.parent) + os.sep
        logs = [log for log in map(process_log, pids) if log]
        return not logs or any(log.startswith(folder) for log in logs)

    # -- threads --------------------------------------------------------------------------------

    def _pending_start(self, token: AttemptToken) -> bool:
        return self._outbox.pending(token, "start")

    def _report(self, token: AttemptToken, kind: str, body: StartBody | FinishBody) -> None:
        self._outbox.put(token, kind, body.model_dump(mode="json", exclude_unset=True))

    def _log_hold(self, report: Report) -> float:
        """When `report` may go (monotonic): a finish waits a little for its log."""
        if report.kind == "finish" and self._logs.holding(report.token):
            return report.queued + FINAL_LOG_WAIT
        return 0.0

    def _heartbeat_call(self, tokens: Sequence[AttemptToken], retry: bool,
                        with_attempts: bool = False) -> protocol.HeartbeatReply:
        body = protocol.HeartbeatBody(
            worker=self.worker, running=protocol.pairs(tokens), with_attempts=with_attempts,
            info={"pid": os.getpid(), "mem_available_gb": mem_available_gb(),
                  "draining": self.draining.is_set(), "stopped": self.stopped,
                  "gate": self.gate.view(), "preflight_failed": self.preflight.failed(),
                  "accounts": self.prober.view(),
                  "account_usage": self.prober.usage_view()})
        answer = self.client.call("POST", "/heartbeat", retry=retry, stop=self._stop,
                                  timeout=self.runner_timeout, json=body.model_dump(mode="json"))
        reply = protocol.HeartbeatReply.model_validate(answer)
        self.learn_lease(reply.lease_seconds)
        if reply.host is not None:
            self.server_gate = reply.host
        if with_attempts:
            self.host_attempts = [(AttemptToken(j, a), w) for j, a, w in reply.attempts]
        return reply

    def _host_heartbeat(self, retry: bool, with_attempts: bool = False) -> None:
        with contextlib.suppress(ConnectionError):
            self._heartbeat_call([], retry=retry, with_attempts=with_attempts)

    def _check_preflight(self) -> bool:
        """Run the job types' preflights that are due (on this, the poll thread); True when
        a verdict changed."""
        gate = self.server_gate
        checks = {} if gate is None else {
            job_type: Check(tuple(check.argv), check.strict, check.timeout, check.cache)
            for job_type, check in gate.preflight.items()}
        probes = {} if gate is None else {
            name: ProbeCommand(tuple(probe.argv), probe.timeout, probe.interval)
            for name, probe in gate.probes.items()}
        probed = self.prober.refresh(probes)
        if not self.preflight.refresh(checks):
            return bool(probed)
        for job_type, detail in sorted(self.preflight.failed().items()):
            log.warning("preflight for job type %s failed (%s): not taking it for now",
                        job_type, detail)
        return True

    def _free(self) -> int:
        """Self-gate: enabled, the current window's worker cap, what is in flight."""
        gate = self.server_gate
        if self.draining.is_set() or gate is None or not gate.enabled:
            return 0
        cap = min(self.concurrency, gate.max_workers)
        return max(0, cap - self.in_flight() - self._inbox.qsize())

    def _poll_loop(self) -> None:
        next_heartbeat = 0.0
        trouble = self.client.backoff()
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_heartbeat:
                    next_heartbeat = time.monotonic() + self.heartbeat_interval
                    self._host_heartbeat(retry=False)
                if self._check_preflight():
                    self._host_heartbeat(retry=False)  # the server hears before we ask
                free = self._free()
                if free <= 0:
                    self._stop.wait(min(1.0, self.heartbeat_interval))
                    continue
                wait = min(self.long_poll, max(0.5, next_heartbeat - time.monotonic()))
                # Before the request left: the server restarts a placement's lease when it
                # hands it out, so the runner's fence must count from no later than this.
                sent = time.monotonic()
                reply = protocol.Assignments.model_validate(self.client.call(
                    "GET", "/assignments", stop=self._stop,
                    params={"worker": self.worker, "free": free, "wait": wait},
                    timeout=wait + 10.0))
                self.learn_lease(reply.lease_seconds)
                now = datetime.now().astimezone()
                for assignment in reply.jobs:
                    job = assignment.job(now)
                    self._asked[job.token] = sent
                    self._inbox.put(job)
                if reply.jobs:
                    self._wake.set()
                trouble.reset()
            except ServerUnavailable:
                continue  # `call` retries these itself; raised only once stopping
            except (ReportGone, RequestRefused) as exc:
                log.error("asking for work failed: %s", exc)
                self._stop.wait(trouble.next())
            except Exception:
                log.exception("asking for work failed; continuing")
                self._stop.wait(trouble.next())

    def _ship_loop(self) -> None:
        self._logs.run(self._stop)


def parse_marker(marker: str) -> tuple[AttemptToken | None, WorkerId | None]:
    token_text, _, worker_text = marker.partition("@")
    job_id, _, attempt = token_text.partition(".")
    if not (job_id.isdigit() and attempt.isdigit()):
        return None, None
    return AttemptToken(int(job_id), int(attempt)), WorkerId.parse(worker_text)


def job_from_assignment(view: dict[str, Any]) -> Job:
    """An assignment as the server sends it, as the job the agent runs."""
    return protocol.Assignment.model_validate(view).job(datetime.now().astimezone())
