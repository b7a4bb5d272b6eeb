"""The agent protocol: what `/api/v1/agent/...` asks of the server for a host's agent (its
work, heartbeats, attempts' starts and ends, logs, its guardian's report)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from herder.core.errors import Conflict, Refused
from herder.core.model import AttemptToken, HostRecord, Job, JobStatus, Outcome
from herder.core.scheduling.alerting import Trouble
from herder.core.settings.sections import Settings
from herder.runtime.accounts import record_probes
from herder.runtime.endings import Ending, PolicyLimits, bind_jobs, record_ending
from herder.runtime.maintenance import PickupWatch, lost_result
from herder.runtime.metrics import Metrics
from herder.runtime.server_state import utcnow
from herder.store import Store
from herder.wire.agents import CheckedJobType, HeartbeatReply, HostChecks, HostGate, pairs

log = logging.getLogger("herder.coordinator")


class AgentService:
    """Answers a host's agent. `gate` is what the agent gates itself by; `poke` asks the
    leader's loop for a placement cycle soon (an attempt ended, a host's attempts were
    lost)."""

    def __init__(self, store: Store, settings: Settings, limits: PolicyLimits,
                 metrics: Metrics, log_dir: Path, lease_seconds: float,
                 gate: Callable[[HostRecord, datetime], HostGate],
                 poke: Callable[[], None]) -> None:
        self.store = store
        self.settings = settings
        self.limits = limits
        self.metrics = metrics
        self.log_dir = log_dir
        self.lease_seconds = lease_seconds
        self.gate = gate
        self.poke = poke
        self.log_grace = LOG_GRACE
        """How long after an attempt ended its host may still ship its log."""

    def _job_on_host(self, label: str, token: AttemptToken) -> Job:
        """The job of an attempt that is live on `label`; Conflict (409) otherwise."""
        job = self.store.job_get(token.job_id)
        if job is None or job.host != label or job.attempt != token.attempt:
            raise Conflict(f"attempt {token} is not live on host {label}: it was declared "
                           "lost, ended, or moved to another host")
        return job

    def take_assigned(self, label: str, worker: str, free: int) -> list[Job]:
        """Placements on `label` for its agent `worker`, bound to it. Only the host's live
        agent takes any: a long poll of a dead agent that the server still holds takes none,
        so what is placed as an agent is replaced waits for the next one (`attempt_take`)."""
        if free <= 0:
            return []
        jobs = self.store.attempt_list_assigned(label, free)
        now = utcnow()
        return bind_jobs(self.store, label, [
            job for job in jobs if self.store.attempt_take(label, job.token, worker, now)],
            now, self.limits)

    def placed_attempt(self, label: str, token: AttemptToken) -> Job | None:
        """The job of an attempt placed on `label` and not started yet (ssh push), with the
        env of the account the launcher bound it to."""
        job = self.store.job_get(token.job_id)
        if (job is None or job.host != label or job.attempt != token.attempt
                or job.status is not JobStatus.CLAIMED):
            return None
        bound = self.store.attempt_get_account(token)
        if bound is None:
            return job
        env = self.store.account_env(*bound)
        if env is None:
            # The account was removed since the launcher bound it: never run without its
            # credentials. The attempt ends as refused (nothing spent, tried again soon,
            # bound afresh); the remote side is told it is not placed.
            log.warning("job %d attempt %d: account %s on %s is gone; not handed out",
                        job.id, job.attempt, bound[1], bound[0])
            record_ending(self.store, job, Outcome.REFUSED, utcnow(), self.limits, ending=Ending(
                launch_error=f"account {bound[1]} on {bound[0]} was removed before the "
                             "attempt started"))
            return None
        return replace(job, env={**job.env, **env})

    def agent_heartbeat(self, label: str, worker: str, running: list[AttemptToken],
                        info: dict[str, Any], with_attempts: bool) -> HeartbeatReply:
        """Renew the host and the attempts its agent runs; say which of them still live."""
        stamp = utcnow()
        self.store.host_heartbeat(label, stamp, {**info, "worker": worker})
        if isinstance(info.get("accounts"), dict):
            record_probes(self.store, label, info["accounts"], stamp,
                          info.get("account_usage"))
        reply = self.store.attempt_heartbeat(label, running, stamp)
        host = self.store.host_get(label)
        attempts = self.store.attempt_list_live(label) if with_attempts else []
        return HeartbeatReply(
            live=pairs(reply.live), cancel=pairs(reply.cancel),
            host=self.gate(host, stamp) if host else None,
            attempts=[(a.attempt.job_id, a.attempt.attempt, a.attempt.worker)
                      for a in attempts],
            lease_seconds=self.lease_seconds)

    def host_checks(self, label: str) -> HostChecks:
        """What `herder doctor --agent` runs on the host: the preflights of the job types
        allowed there (what its heartbeat's gate holds, narrowed) and its accounts' probes.
        Read only: the host is not marked alive. 409 for a host no longer registered (404
        is left to servers without the route)."""
        host = self.store.host_get(label)
        if host is None:
            raise Conflict(f"host {label} is not registered on this server (removed?)")
        gate = self.gate(host, utcnow())
        allowed = host.allowed_job_types
        return HostChecks(
            label=label,
            job_types={name: CheckedJobType(preflight=gate.preflight.get(name),
                                            workspace=job_type.workspace is not None)
                       for name, job_type in sorted(self.settings.job_types.items())
                       if allowed is None or name in allowed},
            probes=gate.probes)

    def agent_trouble(self, label: str, trouble: Trouble, until: datetime,
                      delivered: bool) -> tuple[str, bool]:
        """An agent back from trouble with this server says what it was: raised as the alert
        `agent:<label>:<kind>` (sent by the leader, then cleared by AgentTroubleSweep), or,
        when the agent's own alert URLs sent it already, only recorded (one closed row:
        nothing is sent twice). Its key, and whether it was raised."""
        key = trouble.key(label)
        message = (f"{trouble.describe(label)} from {trouble.since:%Y-%m-%d %H:%M:%S} to "
                   f"{until:%H:%M:%S} UTC; it is back")
        now = utcnow()
        log.error("ALERT: %s", message, extra={"event": "agent_trouble", "host": label})
        if delivered:
            self.store.alert_record(key, message, now)
            return key, False
        self.store.alert_clear(key, now)  # an earlier report's: each stretch is its own row
        self.store.alert_open(key, message, now)
        return key, True

    def push_heartbeat(self, label: str) -> None:
        """A heartbeat from cron's `herder heartbeat` on a push host."""
        self.store.host_heartbeat_push(label, utcnow(), "heartbeat")

    def start_attempt(self, label: str, token: AttemptToken, pid: int,
                      _agent_log_path: str | None) -> None:
        job = self._job_on_host(label, token)
        if job.status is JobStatus.RUNNING:
            # The attempt (job, number, host) started already: this is the agent's retry of
            # a report whose answer it lost (the server restarted mid-call). Accepting it
            # changes nothing; refusing it would make the agent kill a job that runs fine.
            return
        path = self.log_dir / str(token.job_id) / f"{token.attempt}.log"
        now = utcnow()
        if not self.store.attempt_start(token, pid, str(path), now):
            raise Conflict(f"attempt {token} cannot start: it is no longer claimed "
                           "(cancelled or declared lost)")
        self.metrics.started(token.attempt, job.created_at, now)

    def finish_attempt(self, label: str, token: AttemptToken, outcome: Outcome,
                       exit_code: int | None, retry_after: float | None,
                       ending: Ending | None = None) -> JobStatus:
        job = self._job_on_host(label, token)
        now = utcnow()
        if outcome is Outcome.REFUSED:
            # Agents advertise their allow-lists with every heartbeat and placement honours
            # them, so a refusal means the server's view was a heartbeat old. Wait one
            # heartbeat before offering the job again, never in a hot loop.
            retry_after = max(retry_after or 0.0, self.settings.runtime.heartbeat_interval)
        status = record_ending(self.store, job, outcome, now, self.limits, retry_after, ending,
                               exit_code)
        self.poke()
        if status is None:
            raise Conflict(f"attempt {token} has already ended")
        return status

    def agent_gone(self, label: str, worker: str) -> dict[str, int]:
        """An agent died and its guardian killed its jobs' processes: keep new work off the
        host until an agent heartbeats again, then declare that worker's attempts lost at
        once. Fenced by worker id, so a new agent of the host keeps its attempts."""
        now = utcnow()
        stopped = self.store.host_agent_gone(label, worker)
        results = [lost_result(live, now, self.settings.runtime.max_lost)
                   for live in self.store.attempt_list_live(label)
                   if live.attempt.worker == worker]
        applied = self.store.attempt_finish(results, now)
        # Placements nobody took yet wait for no one while the host has no agent.
        handed_back = PickupWatch(self.store, 0.0).run_once(now, label) if stopped else {}
        if applied or handed_back.get("timed_out"):
            self.poke()
        log.warning("agent %s of %s is gone (its guardian says): %d attempt(s) lost%s", worker,
                    label, len(applied),
                    "" if stopped else "; it had stopped cleanly or a newer agent heartbeats")
        return {"lost": len(applied), "host_stopped": int(stopped),
                "handed_back": handed_back.get("timed_out", 0)}

    def adopt_attempt(self, label: str, token: AttemptToken, previous: str,
                      worker: str) -> int:
        """A restarted agent takes over an attempt its predecessor left running (or that
        ended while no agent was up): from now on it is `worker`'s, so the old worker's
        guardian cannot declare it lost. The size of the server's copy of its log, where
        the new agent resumes shipping; Conflict when the attempt is not live there."""
        if not self.store.attempt_adopt(label, token, previous, worker, utcnow()):
            raise Conflict(f"attempt {token} is not live on host {label} under {previous}")
        log.info("agent %s of %s adopted attempt %s from %s", worker, label, token, previous)
        path = self.log_dir / str(token.job_id) / f"{token.attempt}.log"
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return 0

    def live_tokens(self, label: str) -> set[AttemptToken]:
        return {live.attempt.token for live in self.store.attempt_list_live(label)}

    def cancels_for(self, label: str, job_ids: list[int]) -> set[AttemptToken]:
        return self.store.job_cancel_requested(job_ids) & self.live_tokens(label)

    def write_log(self, label: str, token: AttemptToken, offset: int, data: bytes) -> int:
        """Write an agent's log bytes at `offset` (idempotent when a chunk is resent).

        Late chunks of an attempt that already ended, or was declared lost, are still what
        ran on that host: they are kept for `log_grace` after it ended (the agent ships the
        tail right after the finish), then refused (410: the agent stops shipping), so a
        host token cannot fill the disk through every attempt its host ever ran.
        Refused when the chunk would end past `server.max_log_bytes` or start past the
        file's end (a sparse file: a host token could reserve a terabyte with one
        request)."""
        ran = next((a for a in self.store.attempt_list(token.job_id)
                    if a.attempt == token.attempt and a.host == label), None)
        if ran is None:
            job = self.store.job_get(token.job_id)
            if (job is None or job.host != label or job.attempt != token.attempt
                    or job.status.terminal):
                raise Conflict(f"attempt {token} never ran on host {label}")
        else:
            late = late_log_refusal(ran.ended_at, utcnow(), self.log_grace)
            if late is not None:
                raise Refused(*late)
        path = self.log_dir / str(token.job_id) / f"{token.attempt}.log"
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        refusal = log_write_refusal(offset, len(data), size,
                                    self.settings.server.max_log_bytes)
        if refusal is not None:  # refused before anything is created (a log only grows)
            raise Refused(*refusal)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, data, offset)
            return os.fstat(fd).st_size
        finally:
            os.close(fd)


LOG_GRACE = timedelta(minutes=15)
"""How long after an attempt ended (or was declared lost) its log chunks are still taken:
the agent ships the tail right after the finish and gives up retrying it after
agent_client.LOG_GIVE_UP (10 minutes); the rest is margin for a slow round."""


def late_log_refusal(ended_at: datetime | None, now: datetime,
                     grace: timedelta) -> tuple[int, str] | None:
    """(410, why) for a log chunk of an attempt that ended more than `grace` before
    `now`; None while it is live or within the grace."""
    if ended_at is None or now - ended_at <= grace:
        return None
    return 410, (f"the attempt ended at {ended_at.isoformat()}, more than "
                 f"{grace.total_seconds():.0f}s ago: its log is closed")


def log_write_refusal(offset: int, length: int, size: int, cap: int) -> tuple[int, str] | None:
    """Why an agent's chunk of `length` bytes at `offset` is not written to a log file of
    `size` bytes, as (HTTP status, reason); None when it is. A resent chunk (at or before
    the end) is fine; one past the end would leave a hole, one past `cap` is too much."""
    if offset > size:
        return 416, (f"offset: {offset} is past the end of the log ({size} bytes); send the "
                     "log from where it ends")
    if offset + length > cap:
        return 413, (f"the log would pass server.max_log_bytes ({cap} bytes); the rest of "
                     "this attempt's log is not kept")
    return None
