"""`herder server`'s engine, composed: the leader's loops (`leader`), the local hosts
(`local_hosts`), the assignment relay (`relay`), the agent protocol (`agent_service`) and
the read models (`read_models`) over one store and config, started and stopped together.
The operator's operations below are on their way to the operations service."""

from __future__ import annotations

import bisect
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime

from msgspec.structs import replace

from herder.client import Client
from herder.core.config import Config, JobTypeSection, subagent_caps
from herder.core.errors import Conflict, InputError, NotFound
from herder.core.fleet import Fleet
from herder.core.model import (
    Attempt,
    Event,
    InsertResult,
    Job,
    JobSpec,
    JobStatus,
    Reservation,
    ReservationKind,
    ReservationStatus,
    TokenRecord,
    launch_failure,
)
from herder.core.scheduling.explanation import explain
from herder.core.scheduling.placement import Plan, Snapshot
from herder.core.submission import SubmitRequest
from herder.host_settings import declared_host
from herder.intake import resolve
from herder.runtime.accounts import accounts_why, sync_accounts
from herder.runtime.agent_service import AgentService
from herder.runtime.delivery import Alerts, start_alerts
from herder.runtime.endings import PolicyLimits
from herder.runtime.leader import Leader
from herder.runtime.local_hosts import LocalHosts
from herder.runtime.loop_health import LoopRegistry
from herder.runtime.metrics import Metrics
from herder.runtime.preflight import job_type_checks
from herder.runtime.read_models import ReadModels, placed
from herder.runtime.relay import AssignmentRelay
from herder.runtime.runner import default_host
from herder.runtime.scheduler import Scheduler, expires, lease_seconds
from herder.runtime.server_state import ServerState, utcnow
from herder.store import Store
from herder.store.records import DeliveryRecord, JobCapReached
from herder.views import iso
from herder.webhooks import Delivery
from herder.wire.agents import PreflightCheck
from herder.wire.dashboard import JobPage, JobRow
from herder.wire.jobs import SubmitBody

log = logging.getLogger("herder.coordinator")


def _terminate_this_process() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


class Coordinator:
    """The server's engine as one object: it builds the leader, the local hosts, the
    assignment relay, the agent service and the read models over one store and config,
    starts and stops their threads, and takes the process down when one that must live
    ends. Routes reach the parts as attributes (`agents`, `reads`, `local_hosts`)."""

    def __init__(self, store: Store, config: Config, host: str | None = None) -> None:
        self.store = store
        self.config = config
        self.settings = config.settings
        self.fleet = Fleet.from_settings(config.settings)
        self.host = host or config.settings.herder.host or default_host()
        self.limits = PolicyLimits.from_settings(self.settings)
        runtime = self.settings.runtime
        self.lease_seconds = lease_seconds(self.settings, runtime.heartbeat_interval)
        self.state = ServerState()
        self.assignment_listeners = self.state.listeners
        self.preflight_checks = preflight_checks(config.settings.job_types)
        self.scheduler = Scheduler(store, self.fleet, on_assigned=self.state.assigned)
        self.public_url = config.settings.server.public_url or ""
        self.allow_plaintext = config.settings.server.allow_plaintext
        """ssh push hosts may call a plain http public_url (the server's --allow-plaintext)."""
        self.on_fatal: Callable[[], None] = _terminate_this_process
        """Ends the process (SIGTERM to itself: uvicorn shuts down, `herder server` exits 1)
        once a thread that must live ended."""
        self._threads: list[threading.Thread] = []
        self._threads_lock = threading.Lock()  # threads are spawned from several threads
        self._scheduler_thread: threading.Thread | None = None
        self.log_dir = config.log_dir
        self.operations = Client.over(store, config)
        """The operator's commands (retry, drain, logs, accounts, alerts) as the CLI runs
        them against the database, for the API's routes."""
        self.metrics = Metrics()
        self.alerts: Alerts | None = None
        self.reads = ReadModels(self.state, store, self.settings, self.fleet, self.scheduler,
                                self.preflight_checks)
        self.metrics.watch(self.reads.fleet_sample)
        self.local_hosts = LocalHosts(self.state, store, self._spawn, self.host, config,
                                      self.lease_seconds)
        self.leader = Leader(self.state, store, self.settings, self.scheduler, self.metrics,
                             self.host, self.lease_seconds, self.limits, self.log_dir,
                             lambda: self.local_hosts.served, self.reads.measured_ram)
        self.relay = AssignmentRelay(self.state, store)
        self.agents = AgentService(store, self.settings, self.limits, self.metrics,
                                   self.log_dir, self.lease_seconds, self.reads.host_gate,
                                   self.leader.poke)

    # The facts the parts share, as the server and tests read and set them.

    @property
    def is_leader(self) -> bool:
        return self.state.is_leader

    @is_leader.setter
    def is_leader(self, value: bool) -> None:
        self.state.is_leader = value

    @property
    def fatal(self) -> str | None:
        """Why a thread that must live ended: /healthz fails from then on."""
        return self.state.fatal

    @property
    def loops(self) -> LoopRegistry:
        return self.state.loops

    @loops.setter
    def loops(self, registry: LoopRegistry) -> None:
        self.state.loops = registry

    # -- lifecycle ------------------------------------------------------------------------------

    def sync_hosts(self) -> None:
        """Create or update the hosts herder.toml declares; `enabled` (drain) stays the
        operator's, so a restart never undoes `herder host drain`. `herder server` has
        checked them (`check_declared_hosts`) before it got here."""
        now = utcnow()
        for label, section in self.settings.hosts.items():
            record = declared_host(label, section)
            existing = self.store.host_get(label)
            if existing is None:
                self.store.host_insert(record, now)
            else:
                self.store.host_update(replace(record, enabled=existing.enabled), now)
        sync_accounts(self.store, self.settings, now)
        warn_unknown_pinned(self.settings.job_types, {h.label for h in self.store.host_list()})

    def start(self) -> None:
        self.sync_hosts()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._scheduler_thread = self._spawn(self.leader.scheduler_loop, "herder-scheduler")
        self.alerts = start_alerts(self.store, self.settings.alerts, self.state.stop, utcnow,
                                   lambda: self.is_leader, self.leader.scheduler_age)
        # Always: an ssh host added while the server runs (`herder host add`, the API) is
        # placed on at once, so its launcher must already be there.
        self._spawn(functools.partial(self.leader.ssh_loop, self.public_url,
                                      self.allow_plaintext), "herder-ssh")
        # Local hosts: those known now are served before start() returns; the loop follows
        # hosts added, removed or switched to another transport while the server runs.
        self.local_hosts.sync_local_hosts()
        self._spawn(self.local_hosts.local_hosts_loop, "herder-local-hosts")
        if self.store.dialect == "postgres":  # replicas exist only there
            self._spawn(self.relay.run, "herder-assignments")

    def _spawn(self, target: Callable[[], object], name: str,
               until: threading.Event | None = None) -> threading.Thread:
        """Run `target` in a thread that must live as long as the server (or until `until`
        is set): if it ends before, the process is taken down (`on_fatal`) so a supervisor
        restarts it, rather than serving on without it."""

        def guarded() -> None:
            try:
                target()
            except BaseException:
                log.exception("thread %s crashed", name)
            if not self.state.stop.is_set() and not (until is not None and until.is_set()):
                self._fatal(f"thread {name} ended while the server was running")

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        thread.start()
        # Threads of hosts no longer served have ended: keep only those stop() must join.
        with self._threads_lock:
            self._threads = [*[t for t in self._threads if t.is_alive()], thread]
        return thread

    def _fatal(self, reason: str) -> None:
        log.critical("%s; stopping so a supervisor restarts herder", reason)
        self.state.fatal = reason
        self.state.is_leader = False
        self.on_fatal()

    def stop_local(self, timeout: float = 60.0) -> None:
        """Stop every local host's agent while the API still answers, so each hands its
        attempts back (and its guardian is quiet) before the server goes. The loops stop
        first: a job handed back is not placed again here, for a stopping agent's last
        long-poll to take."""
        self.state.stop.set()
        self.leader.poke()
        self.local_hosts.wake()
        deadline = time.monotonic() + timeout
        if self._scheduler_thread is not None:
            self._scheduler_thread.join(max(0.0, deadline - time.monotonic()))
        self.local_hosts.stop_local(deadline)

    def stop(self, timeout: float = 30.0) -> None:
        self.state.stop.set()
        self.leader.poke()
        if self.alerts is not None:
            self.alerts.close()
        self.local_hosts.stop()
        deadline = time.monotonic() + timeout
        with self._threads_lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def poke(self) -> None:
        """Something changed here (a submit, a finish): run a placement cycle soon."""
        self.leader.poke()

    # -- operators' jobs ------------------------------------------------------------------------

    def resolve_submit(self, body: SubmitBody) -> JobSpec:
        """A submit over HTTP, validated against the config (the caller is not on the host
        that runs it: no current directory, no PATH check)."""
        return resolve(self.config, body, utcnow(), local=False, check_command=False)

    def submit(self, spec: JobSpec, force: bool) -> InsertResult:
        """Enqueue a resolved job; InputError (422) when no host can ever take it."""
        hosts = self.store.host_list()
        if hosts:
            self.operations.check_feasible(spec, hosts)
        result = self.store.job_insert([spec], utcnow(), force)[0]
        self.poke()
        return result

    def receive_delivery(self, source: str, delivery: Delivery,
                         requests: Sequence[SubmitRequest]) -> DeliveryRecord:
        """A signed webhook delivery's jobs, validated as an HTTP submit is, then enqueued
        with the delivery's record in one transaction (a replay enqueues nothing)."""
        now = utcnow()
        specs = [resolve(self.config, request, now, local=False, check_command=False)
                 for request in requests]
        record = self.store.delivery_record(source, delivery.delivery_id, delivery.event,
                                            specs, now)
        if record.created:
            self.poke()
        return record

    def job(self, job_id: int) -> Job:
        job = self.store.job_get(job_id)
        if job is None:
            raise NotFound(f"no job {job_id}")
        return job

    def jobs(self, status: list[JobStatus] | None, limit: int) -> list[Job]:
        return self.store.job_list(status, limit)

    def job_page(self, status: JobStatus | None, job_type: str | None, host: str | None,
                 dedup_key: str | None, before: int | None, limit: int) -> JobPage:
        """A page of the dashboard's jobs view; the queued rows on it say why they wait."""
        jobs = self.store.job_list_page(status, job_type, host, dedup_key, before, limit + 1)
        shown = jobs[:limit]
        queued = [job for job in shown if job.status is JobStatus.QUEUED]
        reasons = why_of(self.store, self.fleet, queued, utcnow(),
                         self.reads.recent_placement) if queued else {}
        rows = [JobRow.model_validate(job).model_copy(update={"why": reasons.get(job.id)})
                for job in shown]
        return JobPage(jobs=rows,
                       next_before=shown[-1].id if len(jobs) > limit else None)

    def job_history(self, job_id: int) -> tuple[Job, list[Attempt], list[Event]]:
        return (self.job(job_id), self.store.attempt_list(job_id),
                self.store.event_list(job_id))

    def cancel(self, job_id: int) -> JobStatus:
        """Cancel a queued job at once; a claimed or running one is stopped by its runner."""
        status = self.store.job_cancel(job_id, utcnow())
        return self.job(job_id).status if status is None else status

    def token(self, token_hash: str) -> TokenRecord | None:
        return self.store.token_get(token_hash)

    def why(self, job_id: int) -> str:
        return why(self.store, self.fleet, job_id, utcnow())


def warn_unknown_pinned(job_types: Mapping[str, JobTypeSection],
                        registered: Collection[str]) -> int:
    """Warn once at start for each job type pinned to hosts (`hosts = [...]`) that are not
    registered: herder.toml cannot refuse them, since `herder host add` may add them later,
    but a typo would keep the type's jobs waiting. How many types it warned for."""
    warned = 0
    for name, job_type in job_types.items():
        missing = [label for label in job_type.hosts or () if label not in registered]
        if missing:
            warned += 1
            log.warning("job_types.%s.hosts names %s, not a registered host: its jobs run "
                        "only on the others%s (`herder host add LABEL` registers one)",
                        name, ", ".join(missing),
                        "" if len(missing) < len(job_type.hosts or ())
                        else " and wait until one is registered")
    return warned


def why(store: Store, fleet: Fleet, job_id: int, now: datetime) -> str:
    """One line: why this job is (not) running."""
    job = store.job_get(job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    text = why_of(store, fleet, [job], now)[job.id]
    if job.status in (JobStatus.RUNNING, JobStatus.CLAIMED, JobStatus.DONE) or not job.attempt:
        return text
    # A job that waits or failed because its last attempt could not start says why.
    launch = launch_failure(store.attempt_list(job_id), store.event_list(job_id))
    text += f"; {launch}" if launch else ""
    if job.status is JobStatus.QUEUED and job.available_at > now:
        accounts = accounts_why(store, fleet.accounts, job.job_type, now)  # its reset, say
        text += f"; {accounts}" if accounts else ""
    return text


def why_of(store: Store, fleet: Fleet, jobs: Sequence[Job], now: datetime,
           placement: Callable[[set[int]], tuple[Plan, Snapshot]] | None = None
           ) -> dict[int, str]:
    """`why` for several jobs (a page of the dashboard): the placement the due ones wait on
    is computed once (or taken from `placement`, given their ids), and only if one is due."""
    found = {job.id: text for job in jobs if (text := _settled_why(job, now)) is not None}
    due = [job for job in jobs if job.id not in found]
    if not due:
        return found
    if not store.host_list():
        order = sorted((other.priority, other.id) for other in store.job_list_due(now, 100_000))
        blocked = up_preflight_failures(store)
        for job in due:
            ahead = bisect.bisect_left(order, (job.priority, job.id))
            found[job.id] = (f"queued; no hosts are registered, so `herder up` runs it "
                             f"({ahead} job(s) ahead of it)")
            if job.job_type in blocked:
                found[job.id] += f", but not now: {blocked[job.job_type]}"
            pinned = fleet.policy.pinned.get(job.job_type)
            if pinned is not None:
                found[job.id] += (f", but only one whose --host is one of its type's hosts "
                                  f"({', '.join(sorted(pinned))})")
        return found
    plan, snapshot = (placement({job.id for job in due}) if placement is not None
                      else placed(store, fleet, now))
    found.update((job.id, explain(job.id, plan, snapshot)) for job in due)
    return found


def up_preflight_failures(store: Store) -> dict[str, str]:
    """Job type -> why `herder up` claims none of it (its open `preflight:` alerts)."""
    failures: dict[str, str] = {}
    for alert in store.alert_list(open_only=True, limit=1000):
        kind, _, rest = alert.key.partition(":")
        if kind == "preflight":
            failures.setdefault(rest.partition(":")[2], alert.message)
    return failures


def _settled_why(job: Job, now: datetime) -> str | None:
    """Why, for a job whose answer needs no placement (running, ended, backing off)."""
    if job.status is JobStatus.RUNNING:
        return f"running on {job.host} (attempt {job.attempt})"
    if job.status is JobStatus.CLAIMED:
        return f"placed on {job.host}, waiting for it to start (attempt {job.attempt})"
    if job.status.terminal:
        reason = f" ({job.failure_reason})" if job.failure_reason else ""
        return f"{job.status}{reason}; exit code {job.exit_code}"
    if job.available_at > now:
        wait = (job.available_at - now).total_seconds()
        after = f" after {job.failure_reason}" if job.failure_reason else ""
        until = job.available_at.replace(microsecond=0)
        if job.attempt == 0:  # submitted with a delay (`--delay`, `delay_seconds`)
            return f"not before {iso(until)}: submitted with a delay ({wait:.0f}s to go)"
        return f"waiting {wait:.0f}s for its retry backoff{after} (until {iso(until)})"
    return None


def complete_reservation(store: Store, reservation_id: int, status: ReservationStatus,
                         now: datetime, by: int | None = None) -> Reservation:
    """End an active reservation (with `by`: only one that token made) or say how it
    ended."""
    if status not in (ReservationStatus.DONE, ReservationStatus.FAILED,
                      ReservationStatus.CANCELLED):
        raise InputError("status", f"{status!r} cannot complete a reservation",
                         "use done, failed or cancelled")
    ended = store.reservation_end(reservation_id, status, now, by)
    if ended is not None:
        return ended
    existing = store.reservation_get(reservation_id)
    if existing is None:
        raise NotFound(f"no reservation {reservation_id}")
    return existing


def reserve(store: Store, config: Config, fleet: Fleet, owner: str, label: str, weight: str,
            count: int, now: datetime, created_by: int | None = None,
            max_held: int | None = None, job_id: int | None = None) -> list[Reservation]:
    """Up to `count` subagent slots for `owner` on a host, as many as fit its bookable RAM
    (and, with `max_held`, as keep token `created_by` within that many active ones). Booked
    for job `job_id`, all or none within its weight's `max_subagents_for_weight` there."""
    host = store.host_get(label)
    if host is None:
        raise InputError("host", f"unknown host {label!r}", "see `herder hosts`")
    config.check_weight(weight)
    cap = job_weight = None
    if job_id is not None:
        job = store.job_get(job_id)
        if job is None:
            raise InputError("job", f"no job {job_id}", "name the job that books the slots")
        if job.status not in (JobStatus.CLAIMED, JobStatus.RUNNING):
            raise InputError("job", f"job {job_id} is {job.status}: only a running job books "
                             "subagent slots", "name the running job that books them")
        job_weight = job.weight
        cap = subagent_caps(config.settings).get(job_weight)
    try:
        return store.reservation_create(
            ReservationKind.SUBAGENT, owner, label, weight, fleet.weights.budget(weight), count,
            expires(now, config.settings.fleet.reservation_ttl), fleet.bookable(host), now,
            created_by, max_held, job_id, cap)
    except JobCapReached as reached:
        raise Conflict(
            f"job {job_id} ({job_weight}) holds {reached.held} subagent slot(s) on {label}; "
            f"{count} more would pass [fleet] max_subagents_for_weight.{job_weight} = {cap}: "
            "complete some first (`herder complete`), or raise the cap") from None


def claim_slot(store: Store, config: Config, fleet: Fleet, run_id: str, label: str,
               weight: str, now: datetime, created_by: int | None = None,
               max_held: int | None = None) -> Reservation:
    """A CI run's slot (the live one when the run holds one); Conflict when token
    `created_by` already holds `max_held` reservations and slots."""
    if store.host_get(label) is None:
        raise InputError("host", f"unknown host {label!r}", "see `herder hosts`")
    config.check_weight(weight)
    created = store.reservation_create(
        ReservationKind.CI, run_id, label, weight, fleet.weights.budget(weight), 1,
        expires(now, config.settings.fleet.ci_slot_ttl), None, now, created_by, max_held)
    if not created:
        raise Conflict(f"this token holds {max_held} active reservations and slots "
                       "(server.max_reservations_per_token): release some first")
    return created[0]


def preflight_checks(job_types: Mapping[str, JobTypeSection]) -> dict[str, PreflightCheck]:
    """Each job type's preflight as agents run it (`herder.runtime.preflight.job_type_checks`)."""
    return {name: PreflightCheck(argv=list(check.argv), strict=check.strict,
                                 timeout=check.timeout, cache=check.cache)
            for name, check in job_type_checks(job_types).items()}
