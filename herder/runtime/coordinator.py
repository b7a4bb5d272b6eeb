"""`herder server`: the store, the scheduler (leader only), maintenance, local hosts, and
what the HTTP API asks of them. The API module stays a thin translation layer."""

from __future__ import annotations

import bisect
import contextlib
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from msgspec.structs import replace

from herder.client import Client
from herder.core.backoff import Backoff
from herder.core.errors import Conflict, HerderError, InputError, NotFound, StoreUnavailable
from herder.core.model import (
    Attempt,
    AttemptToken,
    Event,
    HostRecord,
    HostUsage,
    InsertResult,
    Job,
    JobSpec,
    JobStatus,
    Outcome,
    Reservation,
    ReservationKind,
    ReservationStatus,
    TokenRecord,
    Transport,
    launch_failure,
)
from herder.core.scheduling.accounts import state_of
from herder.core.scheduling.alerting import Trouble
from herder.core.scheduling.breaker import Breaker
from herder.core.scheduling.health import shown_health
from herder.core.scheduling.placement import Plan, Snapshot, explain, place
from herder.core.scheduling.policy import SPAWN_OUTCOMES
from herder.core.settings.job_types import JobTypeSection
from herder.core.settings.loading import Config
from herder.core.settings.sections import subagent_caps
from herder.core.submission import SubmitRequest
from herder.host_settings import declared_host
from herder.intake import resolve
from herder.runtime.accounts import (
    accounts_why,
    probe_commands,
    record_probes,
    sync_accounts,
)
from herder.runtime.delivery import Alerts, start_alerts
from herder.runtime.local_child import LocalChild
from herder.runtime.loop_health import Loop, LoopRegistry
from herder.runtime.maintenance import (
    AgentTroubleSweep,
    DeliverySweep,
    PickupWatch,
    RamSpikeWatch,
    Rescuer,
    WorkerId,
    lost_result,
)
from herder.runtime.metrics import FleetSample, HostSample, Metrics
from herder.runtime.preflight import job_type_checks
from herder.runtime.runner import default_host
from herder.runtime.scheduler import (
    Fleet,
    Scheduler,
    agent_state,
    blocked_job_types,
    capacity_now,
    condition,
    expires,
    fleet_cap,
    lease_seconds,
    pickup_timeout_seconds,
    take_snapshot,
)
from herder.runtime.sources import (
    Ending,
    PolicyLimits,
    bind_jobs,
    record_ending,
)
from herder.runtime.ssh import SshLauncher
from herder.store import Store, Waker, as_unavailable
from herder.store.base import ASSIGNED, DeliveryRecord, JobCapReached
from herder.store.driver import Lease
from herder.views import iso
from herder.webhooks import Delivery
from herder.wire import (
    AccountProbe,
    HeartbeatReply,
    HostGate,
    HostView,
    JobPage,
    JobRow,
    PreflightCheck,
    QueueAccount,
    QueueAlert,
    QueueJob,
    QueueView,
    Resilience,
    SubmitBody,
    WindowView,
    pairs,
)

log = logging.getLogger("herder.coordinator")
PLACEMENT_REUSE = 2.0
"""Seconds a placement made for the dashboard's `why` texts serves later pages."""
SSH_INTERVAL = 0.2  # how often the ssh launcher settles its ended ssh processes
SSH_SCAN_INTERVAL = 2.0  # its idle look for placements; a placement wakes it at once
LOCAL_HOSTS_INTERVAL = 2.0  # how often the local hosts are compared with the store's
SPAWN_FAILURE_WINDOW = timedelta(hours=1)
"""How far back `/queue` and `/metrics` count each host's spawn failures."""
RELAY_INTERVAL = 1.0  # the assignment relay's longest wait on the store's NOTIFY
AssignmentListener = Callable[[set[str]], None]
"""Told the hosts that just got work (from the scheduler's thread): the HTTP API wakes the
long-polls of those hosts' agents, the ssh launcher its loop."""


@dataclass
class _SchedulerCycle:
    """What the scheduler loop carries from one cycle to the next."""

    leader_since: float | None = None  # monotonic
    next_maintenance: float = 0.0
    hold_off_until: float = 0.0  # after giving up the lease, not before this
    rescuer: Rescuer | None = None
    pickup: PickupWatch | None = None
    deliveries: DeliverySweep | None = None
    ram: RamSpikeWatch | None = None
    troubles: AgentTroubleSweep | None = None


def _terminate_this_process() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def _close_quietly(waker: Waker) -> None:
    with contextlib.suppress(Exception):
        waker.close()


def run_cycle(loop: Loop, backoff: Backoff, what: str,
              cycle: Callable[[], object]) -> float | None:
    """One cycle of a long-running loop: None when it succeeded, else the backoff delay to
    wait before the next try (the failure recorded in the loop's health and logged)."""
    try:
        cycle()
    except Exception as exc:
        loop.failed(exc)
        delay = backoff.next()
        _log_failure(what, exc, delay)
        return delay
    loop.succeeded()
    backoff.reset()
    return None


def _log_failure(what: str, error: Exception, delay: float) -> None:
    """One line for a database outage (expected, retried); a traceback for anything else."""
    retry = f"; retrying in {delay:.1f}s" if delay else "; retrying"
    unavailable = as_unavailable(error)
    if unavailable is not None:
        log.error("%s failed: %s%s", what, unavailable, retry)
    else:
        log.exception("%s failed%s", what, retry)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Coordinator:
    def __init__(self, store: Store, config: Config, host: str | None = None) -> None:
        self.store = store
        self.config = config
        self.settings = config.settings
        self.fleet = Fleet.from_settings(config.settings)
        self.host = host or config.settings.herder.host or default_host()
        runtime = self.settings.runtime
        self.limits = PolicyLimits.from_settings(self.settings)
        self.lease_seconds = lease_seconds(self.settings, runtime.heartbeat_interval)
        self.assignment_listeners: list[AssignmentListener] = []
        self.preflight_checks = preflight_checks(config.settings.job_types)
        self.scheduler = Scheduler(store, self.fleet, on_assigned=self._assigned)
        self.public_url = config.settings.server.public_url or ""
        self.allow_plaintext = config.settings.server.allow_plaintext
        """ssh push hosts may call a plain http public_url (the server's --allow-plaintext)."""
        self.is_leader = False
        self.loops = LoopRegistry()
        # Set when a thread that must live ended: /healthz fails and `on_fatal` ends the
        # process (SIGTERM to itself: uvicorn shuts down, `herder server` exits 1).
        self.fatal: str | None = None
        self.on_fatal: Callable[[], None] = _terminate_this_process
        self._stop = threading.Event()
        self._poke = threading.Event()
        self._threads: list[threading.Thread] = []
        self._threads_lock = threading.Lock()  # threads are spawned from several threads
        self._local: dict[str, LocalChild] = {}
        self.local_url: str | None = None
        """Where the local hosts' agents reach this server (`serve_local_at`)."""
        self._local_url_known = threading.Event()
        self._scheduler_thread: threading.Thread | None = None
        self.relay_listening = threading.Event()
        """Set once this replica listens for the leader's placements (PostgreSQL only)."""
        self._sync_lock = threading.Lock()
        self._served: frozenset[str] = frozenset()  # local hosts served here
        self._known: frozenset[str] = frozenset()  # every host the last pass saw
        self._local_wake = threading.Event()
        self.log_dir = config.log_dir
        self.log_grace = LOG_GRACE
        self.on_local_token: Callable[[str], None] = lambda key: None
        """Told the hash of each token minted for a local host's agent (the API's failure
        limiter takes it as known-good)."""
        """How long after an attempt ended its host may still ship its log."""
        self.operations = Client.over(store, config)
        """The operator's commands (retry, drain, logs, accounts, alerts) as the CLI runs
        them against the database, for the API's routes."""
        self.metrics = Metrics()
        self.metrics.watch(self.fleet_sample)
        self.alerts: Alerts | None = None
        self._placement: tuple[Plan, Snapshot] | None = None

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
        self._scheduler_thread = self._spawn(self._scheduler_loop, "herder-scheduler")
        self.alerts = start_alerts(self.store, self.settings.alerts, self._stop, utcnow,
                                   lambda: self.is_leader, self._scheduler_age)
        # Always: an ssh host added while the server runs (`herder host add`, the API) is
        # placed on at once, so its launcher must already be there.
        self._spawn(self._ssh_loop, "herder-ssh")
        # Local hosts: those known now are served before start() returns; the loop follows
        # hosts added, removed or switched to another transport while the server runs.
        self.sync_local_hosts()
        self._spawn(self._local_hosts_loop, "herder-local-hosts")
        if self.store.dialect == "postgres":  # replicas exist only there
            self._spawn(self._assignment_relay, "herder-assignments")

    def sync_local_hosts(self) -> dict[str, int]:
        """Serve every host whose transport is `local` from this process (each by a child
        agent, `herder.runtime.local_child`), and no other: how many were started and
        stopped. The child takes its workers from the server with each heartbeat."""
        hosts = self.store.host_list()
        wanted = {host.label for host in hosts if host.transport is Transport.LOCAL}
        counts = {"started": 0, "stopped": 0}
        with self._sync_lock:  # one pass at a time; readers use the snapshots below
            if self._stop.is_set():
                return counts
            for label in [label for label in self._local if label not in wanted]:
                self._local.pop(label).stop()
                log.info("local host %s is no longer served here (removed or not local)",
                         label)
                counts["stopped"] += 1
            for label in sorted(wanted - set(self._local)):
                self._local[label] = self._serve_local(label)
                log.info("serving local host %s", label)
                counts["started"] += 1
            self._served = frozenset(self._local)
            self._known = frozenset(host.label for host in hosts)
        return counts

    def _serve_local(self, label: str) -> LocalChild:
        from herder.runtime.process import process_start_time

        pid = os.getpid()
        config_path = self.config.path
        child = LocalChild(
            self.store, label, url=self._wait_local_url, machine=self.host,
            server_worker=str(WorkerId(self.host, pid, process_start_time(pid) or 0)),
            log_dir=self.log_dir,
            config_path=str(config_path.resolve()) if config_path is not None else None,
            loops=self.loops, heartbeat_interval=self.settings.runtime.heartbeat_interval,
            lease_seconds=self.lease_seconds, on_minted=self.on_local_token)
        self._spawn(functools.partial(child.run, self._stop), f"herder-local-{label}",
                    child.stopped)
        return child

    def serve_local_at(self, url: str) -> None:
        """The plain-HTTP loopback URL of this server's API: its local hosts' agents start
        once it is known (the server knows it once it listens)."""
        self.local_url = url
        self._local_url_known.set()

    def _wait_local_url(self, timeout: float) -> str | None:
        self._local_url_known.wait(timeout)
        return self.local_url

    def stop_local(self, timeout: float = 60.0) -> None:
        """Stop every local host's agent while the API still answers, so each hands its
        attempts back (and its guardian is quiet) before the server goes. The loops stop
        first: a job handed back is not placed again here, for a stopping agent's last
        long-poll to take."""
        self._stop.set()
        self._poke.set()
        self._local_wake.set()
        deadline = time.monotonic() + timeout
        if self._scheduler_thread is not None:
            self._scheduler_thread.join(max(0.0, deadline - time.monotonic()))
        with self._sync_lock:
            children = list(self._local.values())
        for child in children:
            child.stop()
        for child in children:
            child.ended.wait(max(0.0, deadline - time.monotonic()))

    def _local_hosts_loop(self) -> None:
        loop = self.loops.register("local-hosts", LOCAL_HOSTS_INTERVAL)
        backoff = Backoff(base=LOCAL_HOSTS_INTERVAL, cap=10.0)

        # The scheduler placing on a host this pass has not seen (added a moment ago) wakes
        # the loop at once, instead of leaving the placement to its pickup timeout. Called
        # on the scheduler's thread: snapshots only, no lock, no query.
        def assigned(hosts: set[str]) -> None:
            if hosts - self._known:
                self._local_wake.set()

        self.assignment_listeners.append(assigned)
        while not self._stop.is_set():
            delay = run_cycle(loop, backoff, "local hosts", self.sync_local_hosts)
            self._local_wake.wait(LOCAL_HOSTS_INTERVAL if delay is None else delay)
            self._local_wake.clear()
        loop.unregister()

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
            if not self._stop.is_set() and not (until is not None and until.is_set()):
                self._fatal(f"thread {name} ended while the server was running")

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        thread.start()
        # Threads of hosts no longer served have ended: keep only those stop() must join.
        with self._threads_lock:
            self._threads = [*[t for t in self._threads if t.is_alive()], thread]
        return thread

    def _fatal(self, reason: str) -> None:
        log.critical("%s; stopping so a supervisor restarts herder", reason)
        self.fatal = reason
        self.is_leader = False
        self.on_fatal()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._poke.set()
        if self.alerts is not None:
            self.alerts.close()
        self._local_wake.set()
        with self._sync_lock:
            for served in self._local.values():
                served.stop()
        deadline = time.monotonic() + timeout
        with self._threads_lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _scheduler_age(self) -> float | None:
        """Seconds since the scheduler loop's last completed cycle (for the silence alert)."""
        try:
            return self.loops.report("scheduler").age_seconds
        except KeyError:
            return None

    def _assigned(self, hosts: set[str]) -> None:
        for listener in list(self.assignment_listeners):
            listener(hosts)

    def poke(self) -> None:
        """Something changed here (a submit, a finish): run a placement cycle soon."""
        self._poke.set()

    def health_view(self) -> dict[str, Any]:
        """What `/healthz` answers: ok only while every loop has had a recent successful
        cycle. No secrets: loop names, ages and error types only."""
        reports = self.loops.reports()
        return {
            "ok": self.fatal is None and all(report.ok for report in reports),
            "leader": self.is_leader,
            "fatal": self.fatal,
            "loops": {report.name: report.view() for report in reports},
        }

    # -- loops ----------------------------------------------------------------------------------

    def _scheduler_loop(self) -> None:
        """Leader election, placement and maintenance. Store errors (an outage, a restart)
        are retried with backoff; a leader that cannot complete a cycle for its staleness
        limit gives up the lease, so a healthy replica takes over."""
        interval = self.settings.fleet.scheduler_interval
        loop = self.loops.register("scheduler", interval)
        backoff = Backoff(base=min(interval, 0.5), cap=max(interval, 10.0))
        lease = self.store.leader_lease()
        cycle = _SchedulerCycle()
        waker: Waker | None = None

        def cycle_once() -> None:
            nonlocal waker
            if waker is None:
                waker = self.store.listen()
            self._schedule_once(lease, cycle)

        try:
            while not self._stop.is_set():
                delay = run_cycle(loop, backoff, "scheduler cycle", cycle_once)
                if delay is not None:
                    if self.is_leader and not loop.report().ok:
                        self._give_up_lease(lease, cycle, loop.report().age_seconds)
                    self._stop.wait(delay)
                    continue
                assert waker is not None
                try:
                    self._wait(waker, interval)
                except Exception as exc:
                    _log_failure("scheduler waker", exc, 0.0)
                    _close_quietly(waker)
                    waker = None
        finally:
            if waker is not None:
                _close_quietly(waker)
            lease.release()
            self.is_leader = False

    def _schedule_once(self, lease: Lease, cycle: _SchedulerCycle) -> None:
        if time.monotonic() < cycle.hold_off_until:
            self.is_leader = False  # gave the lease up: leave it to a replica for a while
        else:
            try:
                self.is_leader = lease.try_acquire()
            except Exception:
                self.is_leader = False
                raise
        if not self.is_leader:
            cycle.leader_since = None
            return
        now = utcnow()
        if cycle.leader_since is None:
            cycle.leader_since = time.monotonic()
        if cycle.rescuer is None:
            runtime = self.settings.runtime
            cycle.rescuer = Rescuer(self.store, frozenset({self.host}), self.lease_seconds,
                                    runtime.kill_grace, runtime.max_lost, shared=True)
            cycle.pickup = PickupWatch(self.store, pickup_timeout_seconds(self.settings))
            cycle.deliveries = DeliverySweep(self.store, self.settings.hooks.retention)
            cycle.ram = RamSpikeWatch(self.store, self.settings.alerts.ram_low_gb,
                                      self.settings.alerts.ram_low_for, self.measured_ram)
            cycle.troubles = AgentTroubleSweep(self.store, self.settings.alerts.window)
        began = time.perf_counter()
        self.scheduler.run_once(now)
        self.metrics.cycle_seconds.observe(time.perf_counter() - began)
        if time.monotonic() >= cycle.next_maintenance:
            cycle.next_maintenance = time.monotonic() + 1.0
            # A new leader (a restart, a takeover) has heard from no agent yet: give them
            # one lease to heartbeat before judging attempts stale, or an outage longer
            # than the lease would declare every running remote attempt lost (and its agent
            # would kill it).
            rescued: dict[str, int] = {}
            if time.monotonic() - cycle.leader_since >= self.lease_seconds:
                # Local hosts' attempts have their survivors here killed before a requeue;
                # the set follows the hosts the local-hosts loop serves (no query of its own).
                cycle.rescuer.host = frozenset({self.host}) | self._served
                rescued = cycle.rescuer.run_once(now)
            # Placements a new leader inherits get one pickup timeout too.
            assert cycle.pickup is not None
            if time.monotonic() - cycle.leader_since >= cycle.pickup.timeout_seconds:
                cycle.pickup.run_once(now)  # logs each placement it hands back
            expired = self.store.reservation_expire(now)
            assert cycle.deliveries is not None
            cycle.deliveries.run_once(now)
            assert cycle.ram is not None and cycle.troubles is not None
            cycle.ram.run_once(now)
            cycle.troubles.run_once(now)
            self.store.statistics_refresh()
            if any(rescued.values()) or expired:
                log.info("maintenance: %s, %d reservations expired", rescued, expired)

    def measured_ram(self, host: HostRecord, now: datetime) -> float | None:
        """What the host's agent last measured available, while its heartbeat is live."""
        return None if self.fleet.down(host, now) is not None else measured_available_gb(host)

    def _give_up_lease(self, lease: Lease, cycle: _SchedulerCycle, stuck_for: float) -> None:
        hold_off = max(5 * self.settings.fleet.scheduler_interval, 5.0)
        log.error("the scheduler has not completed a cycle for %.0fs as leader: giving up "
                  "the lease for %.0fs so another replica can take over", stuck_for, hold_off)
        lease.release()
        self.is_leader = False
        cycle.leader_since = None
        cycle.hold_off_until = time.monotonic() + hold_off

    def _wait(self, waker: Waker, interval: float) -> None:
        """Until poked, woken by the store, or the interval passes; then debounce a burst."""
        deadline = time.monotonic() + interval
        while not self._stop.is_set():
            if self._poke.is_set():
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0 or waker.wait(min(0.05, remaining)):
                break
        self._poke.clear()
        time.sleep(0.005)

    def _ssh_loop(self) -> None:
        fleet = self.settings.fleet
        pid = os.getpid()
        from herder.runtime.process import process_start_time

        launcher = SshLauncher(
            self.store, self.public_url, fleet.ssh_command, fleet.remote_herder, self.limits,
            self.log_dir, f"{self.host}/{pid}/{process_start_time(pid) or 0}",
            allow_plaintext=self.allow_plaintext,
            preflight=job_type_checks(self.settings.job_types))
        self.assignment_listeners.append(lambda _hosts: launcher.wake.set())
        loop = self.loops.register("ssh", SSH_INTERVAL)
        backoff = Backoff(base=SSH_INTERVAL, cap=10.0)
        next_scan = 0.0
        try:
            while not self._stop.is_set():
                scan = time.monotonic() >= next_scan
                if scan:
                    next_scan = time.monotonic() + SSH_SCAN_INTERVAL
                delay = run_cycle(loop, backoff, "ssh launcher cycle",
                                  functools.partial(launcher.run_once, scan))
                if delay is not None:
                    next_scan = 0.0  # the failed cycle may have been the scan
                    self._stop.wait(delay)
                    continue
                if launcher.wake.wait(SSH_INTERVAL):
                    next_scan = 0.0  # a placement: scan now
                launcher.wake.clear()
        finally:
            launcher.stop()

    def _assignment_relay(self) -> None:
        """A follower hears of the leader's placements through the store's NOTIFY
        (`assigned:HOST`) and tells its own listeners, so agents long-polling this replica
        and its ssh launcher start the work at once instead of at their next poll. The
        leader told its listeners itself."""
        loop = self.loops.register("assignments", RELAY_INTERVAL)
        backoff = Backoff(base=RELAY_INTERVAL, cap=10.0)
        waker: Waker | None = None

        def listen() -> None:
            nonlocal waker
            if waker is None:
                waker = self.store.listen()
            heard = waker.wait_topics(RELAY_INTERVAL)
            if not waker.connected:  # it heals itself; meanwhile a follower's /healthz says so
                if self.is_leader:  # the leader relays nothing: not its health
                    return
                raise StoreUnavailable("the LISTEN connection is down")
            self.relay_listening.set()
            # A placement the old leader made just as this replica took over is not relayed:
            # its agents and launcher find it at their next poll.
            if self.is_leader or heard == set():
                return
            if heard is None:  # a reconnect: what was placed meanwhile is unknown
                hosts = {host.label for host in self.store.host_list()}
            else:
                hosts = {topic.removeprefix(ASSIGNED) for topic in heard
                         if topic.startswith(ASSIGNED)}
            if hosts:
                self._assigned(hosts)

        try:
            while not self._stop.is_set():
                delay = run_cycle(loop, backoff, "assignment relay", listen)
                if delay is not None:
                    self._stop.wait(delay)
        finally:
            if waker is not None:
                _close_quietly(waker)

    # -- what the API asks ------------------------------------------------------------------------

    def _job_on_host(self, label: str, token: AttemptToken) -> Job:
        """The job of an attempt that is live on `label`; Conflict (409) otherwise."""
        job = self.store.job_get(token.job_id)
        if job is None or job.host != label or job.attempt != token.attempt:
            raise Conflict(f"attempt {token} is not live on host {label}: it was declared "
                           "lost, ended, or moved to another host")
        return job

    def take_assigned(self, label: str, worker: str, free: int) -> list[Job]:
        if free <= 0:
            return []
        jobs = self.store.attempt_list_assigned(label, free)
        now = utcnow()
        return bind_jobs(self.store, label, [
            job for job in jobs if self.store.attempt_set_worker(job.token, worker, now)],
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
            host=self.host_gate(host, stamp) if host else None,
            attempts=[(a.attempt.job_id, a.attempt.attempt, a.attempt.worker)
                      for a in attempts],
            lease_seconds=self.lease_seconds)

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
        LogRefused when the chunk would end past `server.max_log_bytes` or start past the
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
                raise LogRefused(*late)
        path = self.log_dir / str(token.job_id) / f"{token.attempt}.log"
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            size = 0
        refusal = log_write_refusal(offset, len(data), size,
                                    self.settings.server.max_log_bytes)
        if refusal is not None:  # refused before anything is created (a log only grows)
            raise LogRefused(*refusal)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, data, offset)
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def host_gate(self, host: HostRecord, now: datetime) -> HostGate:
        """What an agent needs to gate itself before taking work."""
        caps = self.fleet.caps(host, now)
        return HostGate(
            label=host.label, enabled=host.enabled,
            window=self.fleet.policy.schedule.window_at(now),
            max_workers=caps.max_workers, max_weight=caps.max_weight,
            allowed_job_types=_sorted(host.allowed_job_types),
            allowed_weights=_sorted(host.allowed_weights),
            priority_floor=host.priority_floor,
            weights=dict(self.fleet.weights.budgets),
            escalation=list(self.fleet.weights.chain),
            preflight=self.preflight_checks,
            probes={name: AccountProbe(argv=list(probe.argv), timeout=probe.timeout,
                                       interval=probe.interval)
                    for name, probe in probe_commands(self.store.account_list(host.label),
                                                      self.settings).items()})

    def host_views(self) -> list[HostView]:
        now = utcnow()
        usage = self.store.host_usage(now)
        breakers = self.fleet.breakers(self.store, now)
        return [host_status(self.fleet, host, usage.get(host.label), now, breakers)
                for host in self.store.host_list()]

    def fleet_sample(self) -> FleetSample:
        """What `/metrics` reads from the store: GROUP BY counts and one row per host."""
        now = utcnow()
        usage = self.store.host_usage(now)
        records = self.store.host_list()
        hosts = tuple(host_sample(self.fleet, host, usage.get(host.label), now)
                      for host in records)
        return FleetSample(statuses=self.store.job_status_counts(),
                           queue_depth=self.store.job_queue_depth(),
                           failures=self.store.job_failure_counts(), hosts=hosts,
                           leader=self.is_leader,
                           capacity_ratio=capacity_now(self.fleet, records, now),
                           spawn_failures={(host, str(outcome)): count for (host, outcome), count
                                           in self.spawn_failures(now).items()},
                           max_workers=fleet_cap(self.store, self.fleet.max_workers).max_workers)

    def spawn_failures(self, now: datetime) -> dict[tuple[str, Outcome], int]:
        """(host, outcome) -> attempts that failed to start there within the last hour."""
        since = now - SPAWN_FAILURE_WINDOW
        return {key: count for key, count in self.store.attempt_outcome_counts(since).items()
                if key[1] in SPAWN_OUTCOMES}

    def queue_view(self, recent: int) -> QueueView:
        """`/queue`: counts, the newest jobs, hosts, what holds work back, open alerts."""
        counts = self.store.job_status_counts()
        hosts = self.host_views()
        now = utcnow()
        ratio = capacity_now(self.fleet, self.store.host_list(), now)
        spawn: dict[str, dict[str, int]] = {}
        for (host, outcome), count in sorted(self.spawn_failures(now).items()):
            spawn.setdefault(host, {})[str(outcome)] = count
        cooldown = self.settings.fleet.auth_revoked_cooldown
        accounts = []
        for record in self.store.account_list():
            state, detail = state_of(record.health, now, cooldown)
            accounts.append(QueueAccount(
                host=record.account.host, name=record.account.name, state=str(state),
                detail=detail, sessions=record.sessions,
                max_sessions=record.account.max_sessions))
        return QueueView(
            counts={str(status): counts.get(status, 0) for status in JobStatus},
            recent=[QueueJob.of(job) for job in self.store.job_list(None, recent)],
            hosts=hosts,
            resilience=Resilience(
                breakers={h.label: h.breakers for h in hosts if h.breakers},
                preflight_failed={h.label: h.preflight_failed for h in hosts
                                  if h.preflight_failed}),
            accounts=accounts,
            alerts=[QueueAlert(key=alert.key, message=alert.message, opened_at=alert.opened_at)
                    for alert in self.store.alert_list(open_only=True)],
            leader=self.is_leader, capacity_ratio=ratio,
            shed_max_weight=self.fleet.policy.shedding.max_weight(ratio),
            spawn_failures=spawn, fleet_cap=self.operations.fleet_cap())

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
                         self.recent_placement) if queued else {}
        return JobPage(jobs=[JobRow.of_row(job, reasons.get(job.id)) for job in shown],
                       next_before=shown[-1].id if len(jobs) > limit else None)

    def recent_placement(self, job_ids: set[int]) -> tuple[Plan, Snapshot]:
        """A placement at most PLACEMENT_REUSE seconds old that saw these jobs: the
        scheduler's own latest cycle on the leader, else one made here and reused, so a
        dashboard refreshing its jobs view does not place the whole queue each time."""
        now = utcnow()
        for candidate in (self.scheduler.last_placement if self.is_leader else None,
                          self._placement):
            if (candidate is not None
                    and abs((now - candidate[1].now).total_seconds()) <= PLACEMENT_REUSE
                    and job_ids <= {job.id for job in candidate[1].jobs}):
                return candidate
        self._placement = placed(self.store, self.fleet, now)
        return self._placement

    def latest_change(self) -> int:
        """The newest event's id: the dashboard's live view refreshes when it moves."""
        return self.store.event_latest_id()

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


# -- shared by the CLI (direct store access) and the server ---------------------------------------


def _sorted(names: frozenset[str] | None) -> list[str] | None:
    return None if names is None else sorted(names)


def host_status(fleet: Fleet, host: HostRecord, usage: HostUsage | None,
                now: datetime, breakers: Mapping[tuple[str, str], Breaker] | None = None
                ) -> HostView:
    bookable = fleet.bookable(host)
    booked = usage.booked_gb if usage else 0.0
    caps = fleet.caps(host, now)
    liveness = fleet.liveness_of(host, now)
    return HostView(
        label=host.label, enabled=host.enabled, agent=agent_state(host),
        transport=str(host.transport),
        health=str(shown_health(fleet.health(host, now), liveness)),
        last_heartbeat=host.last_heartbeat, agent_down=fleet.agent_down(host, now),
        condition=condition(host),
        liveness=str(liveness.state), missed_heartbeats=liveness.missed,
        heartbeat_age_seconds=None if host.last_heartbeat is None
        else round(max(0.0, (now - host.last_heartbeat).total_seconds()), 1),
        ram_total_gb=host.ram_total_gb, ram_reserved_gb=host.ram_reserved_gb,
        bookable_gb=round(bookable, 3), booked_gb=round(booked, 3),
        free_gb=round(bookable - booked, 3), cpus=host.cpus,
        workers=usage.workers if usage else 0,
        window=fleet.policy.schedule.window_at(now),
        max_workers=caps.max_workers, max_weight=caps.max_weight,
        prime=WindowView(max_workers=host.prime_max_workers,
                         max_weight=host.prime_max_weight),
        night=WindowView(max_workers=host.night_max_workers,
                         max_weight=host.night_max_weight),
        allowed_job_types=_sorted(host.allowed_job_types),
        allowed_weights=_sorted(host.allowed_weights),
        priority_floor=host.priority_floor, labels=sorted(host.labels),
        ssh_target=host.ssh_target, measured_available_gb=measured_available_gb(host),
        breakers={job_type: state.describe() for (label, job_type), state
                  in sorted((breakers or {}).items()) if label == host.label},
        preflight_failed={job_type: detail for job_type, (_, detail)
                          in sorted(blocked_job_types(host).items())})


def host_view(fleet: Fleet, host: HostRecord, usage: HostUsage | None, now: datetime,
              breakers: Mapping[tuple[str, str], Breaker] | None = None) -> dict[str, Any]:
    """`host_status` as JSON-ready data, for `herder hosts --json`."""
    return host_status(fleet, host, usage, now, breakers).model_dump(mode="json")


def measured_available_gb(host: HostRecord) -> float | None:
    """The RAM the host's agent last measured available; None when none said."""
    info = host.agent_info if isinstance(host.agent_info, dict) else {}
    measured = info.get("mem_available_gb")
    if isinstance(measured, int | float) and not isinstance(measured, bool):
        return float(measured)
    return None


def host_sample(fleet: Fleet, host: HostRecord, usage: HostUsage | None,
                now: datetime) -> HostSample:
    """A host as `/metrics` shows it: its RAM (bookable, booked, measured by its agent),
    health, drain and whether a live agent heartbeats for it."""
    info = host.agent_info if isinstance(host.agent_info, dict) else {}
    return HostSample(
        label=host.label, bookable_gb=fleet.bookable(host),
        booked_gb=usage.booked_gb if usage else 0.0,
        measured_available_gb=measured_available_gb(host),
        health=fleet.health(host, now), enabled=host.enabled,
        agent_up=host.transport.pulls and "worker" in info
        and agent_state(host) != "stopped" and fleet.agent_down(host, now) is None)


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


def placed(store: Store, fleet: Fleet, now: datetime) -> tuple[Plan, Snapshot]:
    """A placement of the queue as it is now, and what it was made from."""
    snapshot = take_snapshot(store, fleet, now)
    return place(snapshot), snapshot


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


class LogRefused(HerderError):
    """A log chunk the server does not write: `status` is the HTTP answer (413, 416)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


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
    return 410, (f"the attempt ended at {iso(ended_at)}, more than "
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
