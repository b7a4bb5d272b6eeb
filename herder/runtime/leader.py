"""The loops only the lease holder's work depends on: leader election with placement and
maintenance (the scheduler loop), and the ssh launcher that starts what was placed on ssh
push hosts."""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from herder.core.backoff import Backoff
from herder.core.model import HostRecord
from herder.core.settings.sections import Settings
from herder.runtime.endings import PolicyLimits
from herder.runtime.maintenance import (
    AgentTroubleSweep,
    DeliverySweep,
    PickupWatch,
    RamSpikeWatch,
    Rescuer,
)
from herder.runtime.metrics import Metrics
from herder.runtime.preflight import job_type_checks
from herder.runtime.process import process_start_time
from herder.runtime.scheduler import Scheduler, pickup_timeout_seconds
from herder.runtime.server_state import (
    ServerState,
    close_quietly,
    log_failure,
    run_cycle,
    utcnow,
)
from herder.runtime.ssh import SshLauncher
from herder.store import Store, Waker
from herder.store.driver import Lease

log = logging.getLogger("herder.coordinator")
SSH_INTERVAL = 0.2  # how often the ssh launcher settles its ended ssh processes
SSH_SCAN_INTERVAL = 2.0  # its idle look for placements; a placement wakes it at once


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


class Leader:
    """Takes and keeps the leader lease and, while it holds it, places and maintains; runs
    the ssh launcher. `served` says which local hosts this process serves (their attempts'
    survivors here are killed before a requeue); `measured_ram` what a host's agent last
    measured."""

    def __init__(self, state: ServerState, store: Store, settings: Settings,
                 scheduler: Scheduler, metrics: Metrics, host: str, lease_seconds: float,
                 limits: PolicyLimits, log_dir: Path,
                 served: Callable[[], frozenset[str]],
                 measured_ram: Callable[[HostRecord, datetime], float | None]) -> None:
        self.state = state
        self.store = store
        self.settings = settings
        self.scheduler = scheduler
        self.metrics = metrics
        self.host = host
        self.lease_seconds = lease_seconds
        self.limits = limits
        self.log_dir = log_dir
        self.served = served
        self.measured_ram = measured_ram
        self._poke = threading.Event()

    def poke(self) -> None:
        """Something changed here (a submit, a finish): run a placement cycle soon."""
        self._poke.set()

    def scheduler_age(self) -> float | None:
        """Seconds since the scheduler loop's last completed cycle (for the silence alert)."""
        try:
            return self.state.loops.report("scheduler").age_seconds
        except KeyError:
            return None

    def scheduler_loop(self) -> None:
        """Leader election, placement and maintenance. Store errors (an outage, a restart)
        are retried with backoff; a leader that cannot complete a cycle for its staleness
        limit gives up the lease, so a healthy replica takes over."""
        state = self.state
        interval = self.settings.fleet.scheduler_interval
        loop = state.loops.register("scheduler", interval)
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
            while not state.stop.is_set():
                delay = run_cycle(loop, backoff, "scheduler cycle", cycle_once)
                if delay is not None:
                    if state.is_leader and not loop.report().ok:
                        self._give_up_lease(lease, cycle, loop.report().age_seconds)
                    state.stop.wait(delay)
                    continue
                assert waker is not None
                try:
                    self._wait(waker, interval)
                except Exception as exc:
                    log_failure("scheduler waker", exc, 0.0)
                    close_quietly(waker)
                    waker = None
        finally:
            if waker is not None:
                close_quietly(waker)
            lease.release()
            state.is_leader = False

    def _schedule_once(self, lease: Lease, cycle: _SchedulerCycle) -> None:
        state = self.state
        if time.monotonic() < cycle.hold_off_until:
            state.is_leader = False  # gave the lease up: leave it to a replica for a while
        else:
            try:
                state.is_leader = lease.try_acquire()
            except Exception:
                state.is_leader = False
                raise
        if not state.is_leader:
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
                cycle.rescuer.host = frozenset({self.host}) | self.served()
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

    def _give_up_lease(self, lease: Lease, cycle: _SchedulerCycle, stuck_for: float) -> None:
        hold_off = max(5 * self.settings.fleet.scheduler_interval, 5.0)
        log.error("the scheduler has not completed a cycle for %.0fs as leader: giving up "
                  "the lease for %.0fs so another replica can take over", stuck_for, hold_off)
        lease.release()
        self.state.is_leader = False
        cycle.leader_since = None
        cycle.hold_off_until = time.monotonic() + hold_off

    def _wait(self, waker: Waker, interval: float) -> None:
        """Until poked, woken by the store, or the interval passes; then debounce a burst."""
        deadline = time.monotonic() + interval
        while not self.state.stop.is_set():
            if self._poke.is_set():
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0 or waker.wait(min(0.05, remaining)):
                break
        self._poke.clear()
        time.sleep(0.005)

    def ssh_loop(self, public_url: str, allow_plaintext: bool) -> None:
        """Launch what was placed on ssh push hosts, calling back to `public_url` (plain
        http only with `allow_plaintext`, the server's --allow-plaintext)."""
        fleet = self.settings.fleet
        pid = os.getpid()
        launcher = SshLauncher(
            self.store, public_url, fleet.ssh_command, fleet.remote_herder, self.limits,
            self.log_dir, f"{self.host}/{pid}/{process_start_time(pid) or 0}",
            allow_plaintext=allow_plaintext,
            preflight=job_type_checks(self.settings.job_types))
        self.state.listeners.append(lambda _hosts: launcher.wake.set())
        loop = self.state.loops.register("ssh", SSH_INTERVAL)
        backoff = Backoff(base=SSH_INTERVAL, cap=10.0)
        next_scan = 0.0
        try:
            while not self.state.stop.is_set():
                scan = time.monotonic() >= next_scan
                if scan:
                    next_scan = time.monotonic() + SSH_SCAN_INTERVAL
                delay = run_cycle(loop, backoff, "ssh launcher cycle",
                                  functools.partial(launcher.run_once, scan))
                if delay is not None:
                    next_scan = 0.0  # the failed cycle may have been the scan
                    self.state.stop.wait(delay)
                    continue
                if launcher.wake.wait(SSH_INTERVAL):
                    next_scan = 0.0  # a placement: scan now
                launcher.wake.clear()
        finally:
            launcher.stop()
