"""`herder server`'s engine, composed: the leader's loops (`leader`), the local hosts
(`local_hosts`), the assignment relay (`relay`), the agent protocol (`agent_service`) and
the read models (`read_models`) over one store and config, started and stopped together.
The operator's operations below are on their way to the operations service."""

from __future__ import annotations

import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Collection, Mapping

from msgspec.structs import replace

from herder.core.fleet import Fleet
from herder.core.host_settings import declared_host
from herder.core.settings.job_types import JobTypeSection
from herder.core.settings.loading import Config
from herder.runtime.accounts import sync_accounts
from herder.runtime.agent_service import AgentService
from herder.runtime.delivery import Alerts, start_alerts
from herder.runtime.endings import PolicyLimits
from herder.runtime.leader import Leader
from herder.runtime.local_hosts import LocalHosts
from herder.runtime.loop_health import LoopRegistry
from herder.runtime.metrics import Metrics
from herder.runtime.preflight import job_type_checks
from herder.runtime.read_models import ReadModels
from herder.runtime.relay import AssignmentRelay
from herder.runtime.runner_options import default_host
from herder.runtime.scheduler import Scheduler, lease_seconds
from herder.runtime.server_state import ServerState, utcnow
from herder.store import Store
from herder.wire.agents import PreflightCheck

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


def preflight_checks(job_types: Mapping[str, JobTypeSection]) -> dict[str, PreflightCheck]:
    """Each job type's preflight as agents run it (`herder.runtime.preflight.job_type_checks`)."""
    return {name: PreflightCheck(argv=list(check.argv), strict=check.strict,
                                 timeout=check.timeout, cache=check.cache)
            for name, check in job_type_checks(job_types).items()}
