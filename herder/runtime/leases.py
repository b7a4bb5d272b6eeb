"""A runner's hold on its attempts: it renews their leases by heartbeat, tells a watchdog
each one's backstop, and fences (stops) the attempts it could not renew in time, before the
store or server may run their jobs elsewhere."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime

from herder.core.model import AttemptToken, Outcome
from herder.core.settings.sections import RuntimeSection
from herder.runtime.attempt_files import append_log
from herder.runtime.executor import RunningAttempt
from herder.runtime.fence import FENCE_KILL_SHARE, fence_due, fence_kill_at, fence_margin
from herder.runtime.sources import WorkSource
from herder.runtime.steps import BUSY_TICK, Steps

log = logging.getLogger("herder.runner")


class Leases:
    """The leases of a runner's `running` attempts (the runner's own dict, shared)."""

    def __init__(self, source: WorkSource, runtime: RuntimeSection,
                 running: Mapping[AttemptToken, RunningAttempt], steps: Steps,
                 clock: Callable[[], datetime]) -> None:
        self.source = source
        self.runtime = runtime
        self.running = running
        self.steps = steps
        self.clock = clock
        self.next_renewal = 0.0
        """When the next heartbeat is due (monotonic)."""
        margin = fence_margin(runtime.attempt_lease, runtime.fence_margin)
        if runtime.kill_grace > margin * FENCE_KILL_SHARE:
            log.warning("runtime.kill_grace (%gs) does not fit in %.0f%% of the fence margin "
                        "(%gs, runtime.fence_margin): an attempt cut off from the store gets "
                        "less than kill_grace between SIGTERM and SIGKILL",
                        runtime.kill_grace, FENCE_KILL_SHARE * 100, margin)

    def lease(self) -> tuple[float, float]:
        """The lease the attempts are held to and this runner's fence margin."""
        lease = self.source.lease_seconds or self.runtime.attempt_lease
        return lease, fence_margin(lease, self.runtime.fence_margin)

    def renew(self, mono: float) -> None:
        """The heartbeat: renew every running attempt's lease, and stop those the store or
        server no longer holds live or wants cancelled."""
        self.next_renewal = mono + self.runtime.heartbeat_interval
        tokens = [attempt.token for attempt in self.running.values()]
        # The lease is renewed from when the request left, not when the reply came back:
        # the server stamps it later than that, so the local deadline errs early.
        sent = time.monotonic()
        reply = self.steps.call("heartbeat",
                                lambda: self.source.heartbeat(tokens, self.clock()), mono)
        if reply is None:
            # Retry well before the next interval: every failed beat brings the fence closer.
            retry = self.steps.retry("heartbeat")
            self.next_renewal = min(self.next_renewal, max(retry.due, mono + BUSY_TICK))
            return
        for attempt in self.running.values():
            if attempt.token not in reply.live:
                if attempt.stop_outcome is None:
                    log.warning("job %d attempt %d was fenced out: stopping it",
                                attempt.job.id, attempt.job.attempt)
                attempt.request_stop(Outcome.LOST, mono)
                continue
            attempt.renewed = max(attempt.renewed, sent)
            if attempt.token in reply.cancel:
                attempt.request_stop(Outcome.CANCELLED, mono)
        # Deadlines move only here (and at a start): the watchdog hears of each renewal.
        self.publish()

    def publish(self, starting: Mapping[str, float] | None = None) -> None:
        """Each running (or `starting`: marker -> renewed) attempt's backstop, for a
        watchdog that outlives a frozen runner (the agent's guardian): half a fence margin
        after this runner's own fence, still half a margin before the lease ends and the
        attempt may run elsewhere."""
        lease, margin = self.lease()
        renewed = {attempt.marker: attempt.renewed for attempt in self.running.values()}
        renewed.update(starting or {})
        self.source.leases({marker: at + lease - margin / 2 for marker, at in renewed.items()})

    def fence(self, mono: float) -> None:
        """Stop the attempts whose lease this runner could not renew in time, before the
        store or server may declare them lost and run their jobs elsewhere."""
        lease, margin = self.lease()
        for attempt in self.running.values():
            if attempt.fenced or not fence_due(attempt.renewed, mono, lease, margin):
                continue
            attempt.fenced = True
            kill_at = fence_kill_at(mono, attempt.renewed + lease, self.runtime.kill_grace)
            log.error("job %d attempt %d: its lease was not renewed for %.1fs (lease %gs): "
                      "stopping it before the lease ends", attempt.job.id, attempt.job.attempt,
                      mono - attempt.renewed, lease)
            attempt.request_stop(Outcome.LOST, mono, grace=kill_at - mono)
            if attempt.kill_at is not None and attempt.kill_at > kill_at:
                attempt.kill_at = kill_at  # an earlier stop (a cancel) had a longer grace
            append_log(attempt.log_path, "lease not renewed (cut off from the store or "
                                         "server): stopped before it ends")
