"""The discrete-event simulation: an event heap on a virtual clock, driving herder's own
pure decisions — the placement pass (`place`), the outcome policy (`decide`), account
choice and rotation, the circuit breaker and host health — exactly as the server calls them.

A placement pass runs only when something changed (an arrival, an ending, a job due again,
an outage's edge, a window's edge, a quota's reset, a breaker's pause ending), at the next
tick of the scheduler's cycle; everything else is bookkeeping of what the live code decided.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import msgspec

from herder.core.model import (
    Account,
    AccountHealth,
    AccountRecord,
    Decision,
    JobStatus,
    Outcome,
)
from herder.core.scheduling.accounts import ROTATING, rotated, rotation
from herder.core.scheduling.breaker import Breaker, BreakerState, Ended, breaker
from herder.core.scheduling.capacity import WindowSchedule, bookable_gb
from herder.core.scheduling.health import HostHealth
from herder.core.scheduling.placement import (
    HostLoad,
    PendingJob,
    Reason,
    Snapshot,
    fleet_capacity,
    place,
)
from herder.core.scheduling.policy import RetryState, decide
from herder.core.simulation.report import (
    HostFigures,
    JobLog,
    Report,
    Unplaced,
    percentiles,
)
from herder.core.simulation.scenario import (
    FIRST_ATTEMPT_OUTCOMES,
    Scenario,
    SimAccount,
    TraceJob,
    TraceOutcome,
)

# Event kinds, in the order events of one instant are handled.
_OUTAGE_END = 0
_END = 1
_OUTAGE_START = 2
_ARRIVAL = 3
_DUE = 4
_WAKE = 5

IDLE_EDGES = 4
"""Window edges passed with work queued, nothing running and nothing else to come before
the run gives up on the queued work (two whole days and nights)."""

MAX_OVERRUN = 10 * 365 * 86400.0
"""Virtual seconds after the last arrival past which the run gives up on the jobs still
open: no input may loop forever (a quota that never lets an attempt through)."""
MAX_EVENTS_PER_JOB = 10_000
"""Events handled per job of the trace (plus MAX_EVENTS_BASE) before the run gives up."""
MAX_EVENTS_BASE = 1_000_000


class StuckError(Exception):
    """Work that no host can ever take, or that the run cannot finish: the run stops and
    names it."""

    def __init__(self, unplaced: list[Unplaced], problem: str = "fit no host") -> None:
        super().__init__(f"{len(unplaced)} job(s) {problem}")
        self.unplaced = unplaced
        self.problem = problem


class _Job:
    """A job's mutable state during the run (never escapes `simulate`)."""

    __slots__ = ("attempts", "available", "avoid", "ended", "escalations", "failure_reason",
                 "failures", "first_start", "lost", "outcomes", "pending", "ran_through",
                 "rotated_before", "spawn_failures", "status", "trace", "transient", "weight")

    def __init__(self, trace: TraceJob) -> None:
        self.trace = trace
        self.weight = trace.weight
        self.attempts = 0
        self.failures = 0
        self.lost = 0
        self.transient = 0
        self.spawn_failures = 0
        self.escalations = 0
        self.available = trace.arrival
        self.avoid: str | None = None
        self.first_start: float | None = None
        self.ended: float | None = None
        self.status: JobStatus | None = None
        self.failure_reason: str | None = None
        self.outcomes: list[Outcome] = []
        self.rotated_before = False
        self.pending: PendingJob | None = None
        self.ran_through = False
        """An attempt ran the trace's whole duration to its end (the lower bound's work)."""


class _Attempt:
    __slots__ = ("account", "booked", "full", "host", "job", "outcome", "start", "token",
                 "used")

    def __init__(self, token: int, job: _Job, host: str, booked: float, used: float,
                 start: float, outcome: Outcome, account: tuple[str, str] | None,
                 full: bool = True) -> None:
        self.token = token
        self.job = job
        self.host = host
        self.booked = booked
        self.used = used
        self.start = start
        self.outcome = outcome
        self.account = account
        self.full = full
        """It runs the trace's whole duration (not cut short by a spent quota)."""


class _Account:
    __slots__ = ("health", "period", "sessions", "spec", "used")

    def __init__(self, spec: SimAccount) -> None:
        self.spec = spec
        self.health = AccountHealth()
        self.sessions = 0
        self.used = 0
        self.period = 0

    def record(self) -> AccountRecord:
        spec = self.spec
        return AccountRecord(Account(spec.host, spec.name, max_sessions=spec.max_sessions,
                                     job_types=spec.job_types), self.health, self.sessions)


class _HostState:
    __slots__ = (
        "booked",
        "booked_area",
        "changed",
        "down",
        "down_since",
        "down_spans",
        "peak_booked",
        "peak_used",
        "running",
        "timeline",
        "used",
        "used_area",
    )

    def __init__(self) -> None:
        self.booked = 0.0
        self.used = 0.0
        self.running: dict[int, _Attempt] = {}
        self.booked_area = 0.0
        self.used_area = 0.0
        self.changed = 0.0
        self.down = 0
        self.down_since = 0.0
        self.down_spans: list[tuple[float, float]] = []
        self.peak_booked = 0.0
        self.peak_used = 0.0
        self.timeline: list[tuple[float, float, float]] = []


class _Run:
    """One simulation (mutable inside; `simulate` returns only the frozen report)."""

    def __init__(self, scenario: Scenario, keep_timelines: bool,
                 keep_attempts: bool = False) -> None:
        if not (math.isfinite(scenario.rules.cycle) and scenario.rules.cycle >= 0):
            # 0 x inf is NaN in tick(): no event would ever be due and the loop would spin.
            raise ValueError(f"cycle {scenario.rules.cycle!r} is not a finite number >= 0")
        self.scenario = scenario
        self.attempt_log: list[tuple[int, str, float, float, float]] | None = (
            [] if keep_attempts else None)
        self.rules = scenario.rules
        self.start = scenario.start
        self.keep_timelines = keep_timelines
        self.specs = {spec.label: spec for spec in scenario.hosts}
        self.host_state = {label: _HostState() for label in self.specs}
        self.loads: dict[str, HostLoad] = {
            label: HostLoad(label, HostHealth.HEALTHY, 0, 0.0) for label in self.specs}
        self.jobs = {trace.id: _Job(trace) for trace in scenario.jobs}
        self.queue: dict[int, PendingJob] = {}
        self.heap: list[tuple[float, int, int, int]] = []
        self.sequence = 0
        self.tokens = 0
        self.attempts: dict[int, _Attempt] = {}
        self.accounts = {(spec.host, spec.name): _Account(spec) for spec in scenario.accounts}
        self.accounts_of: dict[str, list[_Account]] = defaultdict(list)
        for account in self.accounts.values():
            self.accounts_of[account.spec.host].append(account)
        self.account_blocked: dict[str, dict[str, tuple[Reason, str]]] = {}
        self.account_dirty: set[str] = set(self.specs)
        self.history: dict[tuple[str, str], list[Ended]] = {}
        self.tripped: set[tuple[str, str]] = set()
        self.breaker_blocked: dict[str, dict[str, tuple[Reason, str]]] = {}
        self.running_types: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.open_jobs = len(self.jobs)
        self.changed = True
        self.idle_edges = 0
        self.pass_count = 0
        self.last_pass: float | None = None
        self.fleet_timeline: list[tuple[float, float, float]] = []
        self.fleet_booked = 0.0
        self.fleet_used = 0.0
        self.shed: set[int] = set()
        self.rotations = 0
        self.rotated_jobs: set[int] = set()
        self.lost_attempts = 0
        self.usage_limits = 0
        self.breaker_trips = 0
        self.hosts_for_type: dict[str, frozenset[str]] = {}
        self.now = 0.0
        self.wakes: set[float] = set()
        self.chance = random.Random(scenario.seed)
        self.spawn_failures = 0
        self.down_hosts = 0
        self.window = self.rules.policy.schedule.window_at(self.start)
        self.caps: dict[str, int] = {}
        self.free_slots = 0
        self.recount_slots()

    # the clock ---------------------------------------------------------------------

    def at(self, seconds: float) -> datetime:
        return self.start + timedelta(seconds=seconds)

    def seconds(self, when: datetime) -> float:
        return (when - self.start).total_seconds()

    def push(self, time: float, kind: int, subject: int = 0) -> None:
        if not math.isfinite(time):
            # A NaN at the heap's top would never pop: the loop would spin for ever.
            raise ValueError(f"event time {time!r} is not finite")
        self.sequence += 1
        heapq.heappush(self.heap, (time, kind, self.sequence, subject))

    def wake(self, time: float) -> None:
        """A placement pass at `time` (a breaker's pause or a quota period ending)."""
        if time not in self.wakes:
            self.wakes.add(time)
            self.push(time, _WAKE, 2)

    def tick(self, time: float) -> float:
        """The first scheduler cycle at or after `time`."""
        cycle = self.rules.cycle
        if cycle <= 0:
            return time
        return math.ceil(time / cycle - 1e-9) * cycle

    def recount_slots(self) -> None:
        """Each host's workers in this window (0 while drained or down) and the free
        slots over the fleet: a pass with no free slot anywhere places nothing, so it is
        skipped."""
        self.caps = {spec.label: max(0, spec.caps(self.window).max_workers)
                     if spec.enabled and not self.host_state[spec.label].down else 0
                     for spec in self.scenario.hosts}
        self.free_slots = sum(max(0, cap - len(self.host_state[label].running))
                              for label, cap in self.caps.items())

    def free_of(self, label: str) -> int:
        return max(0, self.caps[label] - len(self.host_state[label].running))

    # the loop ----------------------------------------------------------------------

    def run(self) -> None:
        for trace in self.scenario.jobs:
            self.push(trace.arrival, _ARRIVAL, trace.id)
        for index, outage in enumerate(self.scenario.outages):
            self.push(outage.start, _OUTAGE_START, index)
            self.push(outage.end, _OUTAGE_END, index)
        edge = next_edge(self.rules.policy.schedule, self.start, 0.0)
        if edge is not None:
            self.push(edge, _WAKE, 1)
        horizon = max((trace.arrival for trace in self.scenario.jobs), default=0.0) + (
            MAX_OVERRUN)
        events_left = MAX_EVENTS_BASE + MAX_EVENTS_PER_JOB * len(self.jobs)
        while self.heap and self.open_jobs > 0:
            time = self.tick(self.heap[0][0])
            if time > horizon or events_left <= 0:
                raise StuckError(self.unplaced(
                    job.trace.id for job in self.jobs.values() if job.status is None),
                    "cannot finish: the run passed its limit of "
                    + ("ten years after the last arrival" if time > horizon
                       else f"{MAX_EVENTS_BASE + MAX_EVENTS_PER_JOB * len(self.jobs)} events"))
            # Each event at its own time (an attempt frees its RAM when it ends); the pass
            # at the scheduler's tick.
            while self.heap and self.heap[0][0] <= time:
                at, kind, _, subject = heapq.heappop(self.heap)
                events_left -= 1
                self.now = max(self.now, at)
                self.handle(kind, subject)
            self.now = time
            if self.changed and self.queue and self.free_slots > 0:
                self.placement_pass()
            self.changed = False
            self.check_stuck()

    def handle(self, kind: int, subject: int) -> None:
        now = self.now
        if kind in (_ARRIVAL, _DUE):
            job = self.jobs[subject]
            if job.status is None and job.pending is None and job.available <= now + 1e-9:
                job.pending = PendingJob(job.trace.id, job.trace.priority, job.weight,
                                         job.trace.job_type, job.trace.affinity, None,
                                         self.at(job.available), job.avoid)
                self.queue[job.trace.id] = job.pending
                self.changed = True
        elif kind == _END:
            attempt = self.attempts.pop(subject, None)
            if attempt is not None:
                if attempt.full:
                    attempt.job.ran_through = True
                self.end_attempt(attempt, attempt.outcome)
        elif kind == _OUTAGE_START:
            outage = self.scenario.outages[subject]
            state = self.host_state[outage.host]
            state.down += 1
            if state.down == 1:
                state.down_since = now
                self.down_hosts += 1
                for attempt in list(state.running.values()):
                    del self.attempts[attempt.token]
                    self.lost_attempts += 1
                    self.end_attempt(attempt, Outcome.LOST)
                self.set_load(outage.host)
                self.recount_slots()
        elif kind == _OUTAGE_END:
            outage = self.scenario.outages[subject]
            state = self.host_state[outage.host]
            state.down -= 1
            if state.down == 0:
                state.down_spans.append((state.down_since, now))
                self.down_hosts -= 1
                self.set_load(outage.host)
                self.recount_slots()
                self.changed = True
        elif kind == _WAKE:
            if subject == 1:  # a window edge: chain the next one
                self.idle_edges += 1
                self.window = self.rules.policy.schedule.window_at(self.at(now))
                self.recount_slots()
                edge = next_edge(self.rules.policy.schedule, self.start, now)
                if edge is not None:
                    self.push(edge, _WAKE, 1)
            else:
                self.account_dirty.update(self.accounts_of)
            self.changed = True

    def check_stuck(self) -> None:
        """Stop when work is queued, nothing runs and nothing but window edges is to come:
        no change can ever place it."""
        if not self.queue or self.attempts:
            self.idle_edges = 0
            return
        if any(kind != _WAKE or subject != 1 for _, kind, _, subject in self.heap):
            self.idle_edges = 0
            return
        if self.idle_edges >= IDLE_EDGES or not self.heap:
            raise StuckError(self.unplaced(list(self.queue)))

    # placement ---------------------------------------------------------------------

    def placement_pass(self) -> None:
        now = self.now
        moment = self.at(now)
        self.refresh_blocked(moment)
        snapshot = Snapshot(moment, list(self.queue.values()), self.scenario.hosts, self.loads,
                            self.rules.weights, self.rules.policy, self.rules.max_workers)
        plan = place(snapshot)
        self.pass_count += 1
        self.note_shed(snapshot)
        if plan.assignments:
            self.idle_edges = 0
        for assignment in plan.assignments:
            self.launch(self.jobs[assignment.job_id], assignment.host)

    def note_shed(self, snapshot: Snapshot) -> None:
        """Jobs the pass held back for shedding (the fleet's capacity below a step)."""
        policy = self.rules.policy
        # With every host up the ratio is whole; fleet_capacity walks the fleet to say so.
        ratio = fleet_capacity(snapshot.hosts, snapshot.loads, policy.schedule.window_at(
            snapshot.now)) if self.down_hosts else 1.0
        cap = policy.shedding.max_weight(ratio)
        if cap is None:
            return
        weights = self.rules.weights
        for job_id, pending in self.queue.items():
            if not weights.allows(cap, pending.weight):
                self.shed.add(job_id)

    def refresh_blocked(self, moment: datetime) -> None:
        """Each host's job types closed by an open breaker or by its accounts, merged into
        its load the way the server's snapshot does."""
        changed: set[str] = set()
        needs = self.rules.accounts.needs
        if needs:
            for label in self.account_dirty:
                records = [account.record() for account in self.accounts_of.get(label, ())]
                blocked = self.rules.accounts.blocked(records, [label], moment).get(label, {})
                if blocked != self.account_blocked.get(label, {}):
                    self.account_blocked[label] = blocked
                    changed.add(label)
            self.account_dirty = set()
        breakers: dict[str, dict[str, tuple[Reason, str]]] = {}
        for key in list(self.tripped):
            state = self.breaker_state(key, moment)
            if state.state is BreakerState.CLOSED:
                self.tripped.discard(key)
                continue
            if state.blocks:
                breakers.setdefault(key[0], {})[key[1]] = (Reason.BREAKER_OPEN,
                                                           state.describe())
        for label in set(breakers) | set(self.breaker_blocked):
            if breakers.get(label) != self.breaker_blocked.get(label):
                changed.add(label)
        self.breaker_blocked = breakers
        for label in changed:
            self.set_load(label)

    def breaker_state(self, key: tuple[str, str], moment: datetime) -> Breaker:
        """The breaker of (host, job type) as `tripped_breakers` reads it from the store."""
        cutoff = moment - timedelta(seconds=self.rules.breaker_history)
        history = [ended for ended in self.history.get(key, ()) if ended.ended_at >= cutoff]
        running = self.running_types.get(key)
        state = breaker(history, self.at(max(running)) if running else None, moment,
                        self.rules.breaker_threshold, self.rules.breaker_pause)
        if state.state is BreakerState.OPEN and state.until is not None:
            self.wake(self.seconds(state.until))
        return state

    def set_load(self, label: str) -> None:
        """The host's HostLoad for the next pass, after anything about it changed."""
        state = self.host_state[label]
        blocked = {**self.breaker_blocked.get(label, {}), **self.account_blocked.get(label, {})}
        self.loads[label] = HostLoad(label, HostHealth.DOWN if state.down else HostHealth.HEALTHY,
                                     len(state.running), state.booked, None, blocked)

    # attempts ----------------------------------------------------------------------

    def launch(self, job: _Job, host: str) -> None:
        """Start an attempt the pass placed: bind an account where the type needs one (as
        the agent does), book its RAM and schedule its end."""
        now = self.now
        trace = job.trace
        del self.queue[trace.id]
        job.pending = None
        account_key: tuple[str, str] | None = None
        failure_rate = self.scenario.spawn_failure.get(host)
        if failure_rate and self.chance.random() < failure_rate:
            # The host could not start it: nothing ran, the spawn budget pays.
            self.spawn_failures += 1
            self.note_ended(host, trace.job_type, Outcome.SPAWN_FAILED)
            self.decide_and_apply(job, host, Outcome.SPAWN_FAILED, None)
            return
        outcome = self.attempt_outcome(job)
        if trace.job_type in self.rules.accounts.needs:
            records = [account.record() for account in self.accounts_of.get(host, ())]
            choice = self.rules.accounts.choose(records, host, trace.job_type, self.at(now))
            if choice.account is None:
                # As the server's bind_accounts: a full host is tried again soon, one
                # without a usable account waits for the first to turn usable.
                refused = choice.full
                self.decide_and_apply(job, host, Outcome.REFUSED if refused
                                      else Outcome.NO_HEALTHY_ACCOUNT,
                                      None if refused else choice.resume_at)
                return
            account = self.accounts[(host, choice.account.name)]
            account_key = (host, choice.account.name)
            period = account.spec.period(now)
            if period != account.period:
                account.period, account.used = period, 0
            quota = account.spec.quota_jobs
            if quota is not None and account.used >= quota:
                outcome = Outcome.USAGE_BLOCKED
            account.used += 1
            account.sessions += 1
            self.account_dirty.add(host)
        self.tokens += 1
        budget = self.rules.weights.budget(job.weight)
        cut_short = outcome is Outcome.USAGE_BLOCKED and (
            trace.outcome is not TraceOutcome.USAGE_LIMIT or job.attempts > 0)
        duration = 0.0 if cut_short else trace.duration
        attempt = _Attempt(self.tokens, job, host, budget, trace.peak_gb, now, outcome,
                           account_key, full=not cut_short)
        job.attempts += 1
        if job.first_start is None:
            job.first_start = now
        self.attempts[attempt.token] = attempt
        state = self.host_state[host]
        self.account_area(host)
        self.free_slots -= self.free_of(host)
        state.running[attempt.token] = attempt
        self.free_slots += self.free_of(host)
        state.booked += budget
        state.used += trace.peak_gb
        self.after_change(host, budget, trace.peak_gb)
        self.running_types[(host, trace.job_type)].append(now)
        self.push(now + duration, _END, attempt.token)

    def attempt_outcome(self, job: _Job) -> Outcome:
        """What this attempt of the job ends in, by the trace's word (docs/simulate.md)."""
        trace = job.trace
        if trace.outcome is TraceOutcome.FAIL:
            return Outcome.FAILED
        outcome = FIRST_ATTEMPT_OUTCOMES.get(trace.outcome)
        if outcome is None:
            return Outcome.OK
        if job.attempts == 0:
            return outcome
        if outcome in (Outcome.OOM, Outcome.NEEDS_HEAVIER) and (
                self.rules.weights.budget(job.weight) < trace.peak_gb):
            return outcome
        return Outcome.OK

    def end_attempt(self, attempt: _Attempt, outcome: Outcome) -> None:
        now = self.now
        job = attempt.job
        host = attempt.host
        state = self.host_state[host]
        self.account_area(host)
        if self.attempt_log is not None:
            self.attempt_log.append((job.trace.id, host, attempt.start, now, attempt.booked))
            job.outcomes.append(outcome)
        self.free_slots -= self.free_of(host)
        del state.running[attempt.token]
        self.free_slots += self.free_of(host)
        state.booked -= attempt.booked
        state.used -= attempt.used
        if not state.running:
            state.booked = state.used = 0.0  # no drift from float sums
        self.after_change(host, -attempt.booked, -attempt.used)
        key = (host, job.trace.job_type)
        starts = self.running_types[key]
        starts.remove(attempt.start)
        self.note_ended(host, job.trace.job_type, outcome)
        resume_at: datetime | None = None
        marked: tuple[str, str] | None = None
        if outcome is Outcome.USAGE_BLOCKED:
            self.usage_limits += 1
        if attempt.account is not None:
            account = self.accounts[attempt.account]
            account.sessions -= 1
            self.account_dirty.add(host)
            if outcome is Outcome.USAGE_BLOCKED:
                until = account.spec.next_reset(now)
                resume_at = self.at(until)
                account.health = msgspec.structs.replace(account.health,
                                                         depleted_until=resume_at)
                marked = attempt.account
                self.wake(until)
            elif outcome is Outcome.OK:
                account.health = AccountHealth()
        self.decide_and_apply(job, host, outcome, resume_at, marked)
        self.changed = True

    def note_ended(self, host: str, job_type: str, outcome: Outcome) -> None:
        """Add an ended attempt to its (host, job type) breaker history."""
        key = (host, job_type)
        history = self.history.setdefault(key, [])
        history.insert(0, Ended(outcome, self.at(self.now)))
        del history[self.rules.breaker_threshold:]
        if len(history) >= self.rules.breaker_threshold and all(
                ended.outcome is Outcome.TRANSIENT for ended in history):
            if key not in self.tripped:
                self.breaker_trips += 1
            self.tripped.add(key)

    def decide_and_apply(self, job: _Job, host: str, outcome: Outcome,
                         resume_at: datetime | None,
                         marked: tuple[str, str] | None = None) -> None:
        """The outcome policy's decision (`decide`, as the endings apply it), the account
        rotation where an account failed the job, and the job's next state."""
        now = self.now
        moment = self.at(now)
        rules = self.rules
        job_type = job.trace.job_type
        base, cap = rules.backoff.get(job_type, rules.default_backoff)
        state = RetryState(job.failures, job.lost, rules.max_attempts.get(
            job_type, rules.default_max_attempts), base, cap, job.spawn_failures,
            job.transient, rules.max_transient.get(job_type, rules.default_max_transient),
            escalations=job.escalations, weight=job.weight,
            heavier=rules.weights.heavier(job.weight))
        decision = decide(outcome, state, moment, rules.max_lost,
                          max_spawn_failures=rules.max_spawn_failures,
                          spawn_backoff_seconds=rules.spawn_backoff, resume_at=resume_at,
                          rules=rules.rules_for(job_type))
        if marked is not None and outcome in ROTATING:
            again = job.rotated_before
            found = rotation([account.record() for account in self.accounts.values()], marked,
                             job_type, rules.accounts.needs.get(job_type), moment,
                             self.hosts_for(job.trace), rules.accounts.cooldown,
                             serve=not again)
            decision = rotated(decision, outcome, found, marked, moment, again)
            job.rotated_before = found.serves is not None and not again
            if found.serves is not None and not again:
                self.rotations += 1
                self.rotated_jobs.add(job.trace.id)
        elif outcome not in (Outcome.REFUSED, Outcome.NO_HEALTHY_ACCOUNT):
            job.rotated_before = False
        self.apply(job, host, decision)

    def apply(self, job: _Job, host: str, decision: Decision) -> None:
        now = self.now
        job.failures += decision.spend_failure
        job.lost += decision.spend_lost
        job.spawn_failures += decision.spend_spawn_failure
        job.transient += decision.spend_transient
        if decision.status is not JobStatus.QUEUED:
            job.status = decision.status
            job.failure_reason = decision.failure_reason
            job.ended = now
            self.open_jobs -= 1
            return
        if decision.weight is not None and decision.weight != job.weight:
            job.weight = decision.weight
            job.escalations += 1
        job.avoid = host if decision.avoid_host else None
        available = decision.available_at
        job.available = max(now, self.seconds(available)) if available is not None else now
        self.push(job.available, _DUE, job.trace.id)

    def hosts_for(self, trace: TraceJob) -> frozenset[str]:
        """The hosts that may run a job of this type (as the endings' `hosts_for`)."""
        found = self.hosts_for_type.get(trace.job_type)
        if found is None:
            found = frozenset(spec.label for spec in self.scenario.hosts if spec.enabled and (
                spec.allowed_job_types is None or trace.job_type in spec.allowed_job_types))
            pinned = self.rules.policy.pinned.get(trace.job_type)
            if pinned is not None:
                found &= pinned
            self.hosts_for_type[trace.job_type] = found
        if trace.affinity is not None:
            return found & {trace.affinity}
        return found

    # figures -----------------------------------------------------------------------

    def account_area(self, label: str) -> None:
        """Add the host's RAM booked and used since its last change to its integrals."""
        state = self.host_state[label]
        span = self.now - state.changed
        if span > 0:
            state.booked_area += state.booked * span
            state.used_area += state.used * span
        state.changed = self.now

    def after_change(self, label: str, booked: float, used: float) -> None:
        """Record a host's change of `booked` and `used` GB at the current time."""
        state = self.host_state[label]
        state.peak_booked = max(state.peak_booked, state.booked)
        state.peak_used = max(state.peak_used, state.used)
        if self.keep_timelines:
            timeline = state.timeline
            if timeline and timeline[-1][0] == self.now:
                timeline.pop()
            timeline.append((self.now, state.booked, state.used))
        self.set_load(label)
        self.fleet_booked += booked
        self.fleet_used += used
        if not self.attempts:
            self.fleet_booked = self.fleet_used = 0.0  # no drift from float sums
        fleet = self.fleet_timeline
        if fleet and fleet[-1][0] == self.now:
            fleet.pop()
        fleet.append((self.now, self.fleet_booked, self.fleet_used))

    def unplaced(self, job_ids: Iterable[int]) -> list[Unplaced]:
        found = []
        for job_id in sorted(job_ids):
            job = self.jobs[job_id]
            found.append(Unplaced(job_id, job.trace.job_type, job.weight, job.trace.priority))
        return found

    def report(self) -> Report:
        jobs = list(self.jobs.values())
        first = min((job.trace.arrival for job in jobs), default=0.0)
        last = max((job.ended for job in jobs if job.ended is not None), default=first)
        makespan = last - first
        for label in self.host_state:
            self.now = last
            self.account_area(label)
        hosts = []
        capacity_area = 0.0
        fraction = self.rules.policy.bookable_fraction
        for spec in self.scenario.hosts:
            state = self.host_state[spec.label]
            spans = state.down_spans + ([(state.down_since, last)] if state.down else [])
            # Only the time down inside the measured span [first, last] takes from it.
            down = sum(max(0.0, min(end, last) - max(begin, first)) for begin, end in spans)
            up = max(0.0, makespan - min(down, makespan))
            bookable = bookable_gb(spec.ram_total_gb, spec.ram_reserved_gb, fraction)
            capacity_area += bookable * up
            hosts.append(HostFigures(
                spec.label, bookable,
                state.booked_area / makespan if makespan > 0 else 0.0,
                state.used_area / makespan if makespan > 0 else 0.0,
                state.peak_booked, state.peak_used, tuple(state.timeline)))
        work = sum(self.rules.weights.budget(job.trace.weight) * job.trace.duration
                   for job in jobs if job.ran_through)
        booked = sum(state.booked_area for state in self.host_state.values())
        used = sum(state.used_area for state in self.host_state.values())
        waits_by_weight: dict[str, list[float]] = defaultdict(list)
        waits_by_priority: dict[int, list[float]] = defaultdict(list)
        for job in jobs:
            if job.first_start is None:
                continue
            wait = job.first_start - job.trace.arrival
            waits_by_weight[job.trace.weight].append(wait)
            waits_by_priority[job.trace.priority].append(wait)
        statuses = [job.status for job in jobs]
        return Report(
            jobs=len(jobs),
            done=statuses.count(JobStatus.DONE),
            failed=statuses.count(JobStatus.FAILED),
            makespan=makespan,
            escalated=sum(1 for job in jobs if job.escalations),
            shed=len(self.shed),
            rotated=len(self.rotated_jobs),
            rotations=self.rotations,
            usage_limits=self.usage_limits,
            lost_attempts=self.lost_attempts,
            spawn_failures=self.spawn_failures,
            breaker_trips=self.breaker_trips,
            attempts=sum(job.attempts for job in jobs),
            placement_passes=self.pass_count,
            work_gb_seconds=work,
            booked_gb_seconds=booked,
            used_gb_seconds=used,
            capacity_gb_seconds=capacity_area,
            wait_by_weight={weight: percentiles(waits)
                            for weight, waits in sorted(waits_by_weight.items())},
            wait_by_priority={str(priority): percentiles(waits)
                              for priority, waits in sorted(waits_by_priority.items())},
            hosts=tuple(hosts),
            fleet_timeline=tuple(self.fleet_timeline),
            attempt_log=tuple(self.attempt_log or ()),
            job_log=tuple(JobLog(job.trace.id, str(job.status), job.failure_reason,
                                 job.weight, tuple(str(outcome) for outcome in job.outcomes))
                          for job in sorted(jobs, key=lambda job: job.trace.id))
            if self.attempt_log is not None else (),
        )


def next_edge(schedule: WindowSchedule, start: datetime, after: float) -> float | None:
    """Seconds after `start` of the first window edge (night starting or ending) strictly
    after `after`; None when the schedule has no night."""
    if schedule.night_start == schedule.night_end:
        return None
    zone = ZoneInfo(schedule.timezone)
    moment = start + timedelta(seconds=after)
    local = moment.astimezone(zone)
    best: float | None = None
    for days in range(3):
        day = (local + timedelta(days=days)).date()
        for clock in (schedule.night_start, schedule.night_end):
            candidate = datetime.combine(day, clock, zone)
            seconds = (candidate - start).total_seconds()
            if seconds > after + 1e-6 and (best is None or seconds < best):
                best = seconds
    return best


def never_placed(scenario: Scenario) -> list[Unplaced]:
    """The jobs no host could take even with the whole fleet empty and healthy, in either
    window (their weight, type, priority or affinity fits no host): placement asked once
    per shape of job, at a prime moment and a night moment."""
    rules = scenario.rules
    schedule = rules.policy.schedule
    moments = [scenario.start]
    edge = next_edge(schedule, scenario.start, 0.0)
    if edge is not None:
        moments.append(scenario.start + timedelta(seconds=edge))
        following = next_edge(schedule, scenario.start, edge)
        if following is not None:
            moments.append(scenario.start + timedelta(seconds=following))
    labels = [spec.label for spec in scenario.hosts]
    blocked: dict[str, dict[str, tuple[Reason, str]]] = {}
    if rules.accounts.needs:
        by_host: dict[str, list[AccountRecord]] = defaultdict(list)
        for spec in scenario.accounts:
            by_host[spec.host].append(_Account(spec).record())
        for label in labels:
            blocked.update(rules.accounts.blocked(by_host.get(label, []), [label],
                                                  scenario.start))
    loads = {label: HostLoad(label, HostHealth.HEALTHY, 0, 0.0, None, blocked.get(label, {}))
             for label in labels}
    shapes: dict[tuple[str, str, int, str | None], list[int]] = defaultdict(list)
    for trace in scenario.jobs:
        shapes[(trace.job_type, trace.weight, trace.priority, trace.affinity)].append(trace.id)
    found: list[Unplaced] = []
    for (job_type, weight, priority, affinity), ids in shapes.items():
        probe = PendingJob(ids[0], priority, weight, job_type, affinity)
        if not any(place(Snapshot(moment, [probe], scenario.hosts, loads, rules.weights,
                                  rules.policy, rules.max_workers)).assignments
                   for moment in moments):
            found.extend(Unplaced(job_id, job_type, weight, priority) for job_id in ids)
    return sorted(found, key=lambda item: item.job_id)


def simulate(scenario: Scenario, keep_timelines: bool = False,
             keep_attempts: bool = False) -> Report:
    """Run the scenario to its end. Raises StuckError naming the jobs that no host can
    ever take (checked before the run, and again when the run can make no progress).
    `keep_timelines` keeps each host's RAM over time (charts); `keep_attempts` every
    attempt as (job id, host, start, end, GB booked)."""
    unplaced = never_placed(scenario)
    if unplaced:
        raise StuckError(unplaced)
    run = _Run(scenario, keep_timelines, keep_attempts)
    run.run()
    return run.report()

