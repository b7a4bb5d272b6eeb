"""The hosts `herder server` (and `herder up --ui`) serves itself: each host whose transport
is `local` gets a child agent of this process (`herder.runtime.local_child`), started and
stopped as the store's hosts change."""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable

from herder.core.backoff import Backoff
from herder.core.model import Transport, WorkerId
from herder.core.settings.loading import Config
from herder.runtime.local_child import LocalChild
from herder.runtime.process import process_start_time
from herder.runtime.server_state import ServerState, run_cycle
from herder.store import Store

log = logging.getLogger("herder.coordinator")
LOCAL_HOSTS_INTERVAL = 2.0  # how often the local hosts are compared with the store's
Spawn = Callable[[Callable[[], object], str, threading.Event | None], threading.Thread]
"""Runs a thread that must live as long as the server (or until the event is set)."""


class LocalHosts:
    """The child agents of the local hosts served here, keyed by host label."""

    def __init__(self, state: ServerState, store: Store, spawn: Spawn, machine: str,
                 config: Config, lease_seconds: float) -> None:
        self.state = state
        self.store = store
        self.spawn = spawn
        self.machine = machine
        self.config = config
        self.lease_seconds = lease_seconds
        self._local: dict[str, LocalChild] = {}
        self.local_url: str | None = None
        """Where the local hosts' agents reach this server (`serve_local_at`)."""
        self._local_url_known = threading.Event()
        self._sync_lock = threading.Lock()
        self.served: frozenset[str] = frozenset()  # local hosts served here
        self._known: frozenset[str] = frozenset()  # every host the last pass saw
        self._local_wake = threading.Event()
        self.on_local_token: Callable[[str], None] = lambda key: None
        """Told the hash of each token minted for a local host's agent (the API's failure
        limiter takes it as known-good)."""

    def sync_local_hosts(self) -> dict[str, int]:
        """Serve every host whose transport is `local` from this process (each by a child
        agent, `herder.runtime.local_child`), and no other: how many were started and
        stopped. The child takes its workers from the server with each heartbeat."""
        hosts = self.store.host_list()
        wanted = {host.label for host in hosts if host.transport is Transport.LOCAL}
        counts = {"started": 0, "stopped": 0}
        with self._sync_lock:  # one pass at a time; readers use the snapshots below
            if self.state.stop.is_set():
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
            self.served = frozenset(self._local)
            self._known = frozenset(host.label for host in hosts)
        return counts

    def _serve_local(self, label: str) -> LocalChild:
        pid = os.getpid()
        config_path = self.config.path
        child = LocalChild(
            self.store, label, url=self._wait_local_url, machine=self.machine,
            server_worker=str(WorkerId(self.machine, pid, process_start_time(pid) or 0)),
            log_dir=self.config.log_dir,
            config_path=str(config_path.resolve()) if config_path is not None else None,
            loops=self.state.loops,
            heartbeat_interval=self.config.settings.runtime.heartbeat_interval,
            lease_seconds=self.lease_seconds, on_minted=self.on_local_token)
        self.spawn(functools.partial(child.run, self.state.stop), f"herder-local-{label}",
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

    def wake(self) -> None:
        """End the loop's wait now (the server stops)."""
        self._local_wake.set()

    def stop_local(self, deadline: float) -> None:
        """Stop every local host's agent and wait, until monotonic `deadline`, for each to
        hand its attempts back."""
        with self._sync_lock:
            children = list(self._local.values())
        for child in children:
            child.stop()
        for child in children:
            child.ended.wait(max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        """Tell every local host's agent to stop (without waiting)."""
        self._local_wake.set()
        with self._sync_lock:
            for served in self._local.values():
                served.stop()

    def local_hosts_loop(self) -> None:
        loop = self.state.loops.register("local-hosts", LOCAL_HOSTS_INTERVAL)
        backoff = Backoff(base=LOCAL_HOSTS_INTERVAL, cap=10.0)

        # The scheduler placing on a host this pass has not seen (added a moment ago) wakes
        # the loop at once, instead of leaving the placement to its pickup timeout. Called
        # on the scheduler's thread: snapshots only, no lock, no query.
        def assigned(hosts: set[str]) -> None:
            if hosts - self._known:
                self._local_wake.set()

        self.state.listeners.append(assigned)
        while not self.state.stop.is_set():
            delay = run_cycle(loop, backoff, "local hosts", self.sync_local_hosts)
            self._local_wake.wait(LOCAL_HOSTS_INTERVAL if delay is None else delay)
            self._local_wake.clear()
        loop.unregister()
