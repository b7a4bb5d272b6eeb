"""The assignment relay: a replica that does not lead hears of the leader's placements
through the store's NOTIFY and wakes its own agents' long-polls and ssh launcher."""

from __future__ import annotations

import threading

from herder.core.backoff import Backoff
from herder.core.errors import StoreUnavailable
from herder.runtime.server_state import ServerState, close_quietly, run_cycle
from herder.store import Store, Waker
from herder.store.records import ASSIGNED

RELAY_INTERVAL = 1.0  # the assignment relay's longest wait on the store's NOTIFY


class AssignmentRelay:
    """Relays `assigned:HOST` notifications to the server's assignment listeners (PostgreSQL
    only: replicas exist only there)."""

    def __init__(self, state: ServerState, store: Store) -> None:
        self.state = state
        self.store = store
        self.listening = threading.Event()
        """Set once this replica listens for the leader's placements."""

    def run(self) -> None:
        """A follower hears of the leader's placements through the store's NOTIFY
        (`assigned:HOST`) and tells its own listeners, so agents long-polling this replica
        and its ssh launcher start the work at once instead of at their next poll. The
        leader told its listeners itself."""
        state = self.state
        loop = state.loops.register("assignments", RELAY_INTERVAL)
        backoff = Backoff(base=RELAY_INTERVAL, cap=10.0)
        waker: Waker | None = None

        def listen() -> None:
            nonlocal waker
            if waker is None:
                waker = self.store.listen()
            heard = waker.wait_topics(RELAY_INTERVAL)
            if not waker.connected:  # it heals itself; meanwhile a follower's /healthz says so
                if state.is_leader:  # the leader relays nothing: not its health
                    return
                raise StoreUnavailable("the LISTEN connection is down")
            self.listening.set()
            # A placement the old leader made just as this replica took over is not relayed:
            # its agents and launcher find it at their next poll.
            if state.is_leader or heard == set():
                return
            if heard is None:  # a reconnect: what was placed meanwhile is unknown
                hosts = {host.label for host in self.store.host_list()}
            else:
                hosts = {topic.removeprefix(ASSIGNED) for topic in heard
                         if topic.startswith(ASSIGNED)}
            if hosts:
                state.assigned(hosts)

        try:
            while not state.stop.is_set():
                delay = run_cycle(loop, backoff, "assignment relay", listen)
                if delay is not None:
                    state.stop.wait(delay)
        finally:
            if waker is not None:
                close_quietly(waker)
