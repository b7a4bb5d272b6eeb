"""The vocabulary of herder as plain frozen values, shared by the core and the shell."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import msgspec

from herder.core.settings.job_defaults import DefaultsSection

JSONObject = Mapping[str, Any]
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
"""The store's integer columns."""
BIGINT_MAX = 2**63 - 1
"""The store's ids."""
RAM_TOLERANCE_GB = 1e-9
"""Slack on every RAM check (placement, the stores' re-check, the demo's summary) so float
sums (22.4 − 3 − 3 …, 3 + 3 + 2.4 against 8.4) never refuse an exact fit."""
LAUNCH_ERROR_CHARS = 1000
"""The longest launch error (an OS error's text) an attempt keeps."""
"""Longer is surely a typo, and would overflow datetime arithmetic downstream."""
ADHOC = "adhoc"
"""The job type of a job submitted as a command rather than as a job type."""


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    CLAIMED = "claimed"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def active(self) -> bool:
        """Active jobs hold their dedup key and a slot; terminal ones do not."""
        return self in ACTIVE_STATUSES

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATUSES


ACTIVE_STATUSES = frozenset({JobStatus.QUEUED, JobStatus.CLAIMED, JobStatus.RUNNING})
TERMINAL_STATUSES = frozenset({JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED})


class Outcome(enum.StrEnum):
    """What one attempt ended in; the policy maps it to what happens to the job."""

    OK = "ok"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    LOST = "lost"
    LAUNCH_FAILED = "launch_failed"
    REFUSED = "refused"
    RAM_CONTENTION = "ram_contention"
    SPAWN_FAILED = "spawn_failed"
    # Read from the log or the exit code (herder.core.scheduling.classification).
    TRANSIENT = "transient"
    USAGE_BLOCKED = "usage_blocked"
    NEEDS_HEAVIER = "needs_heavier"
    OOM = "oom"
    AUTH_REVOKED = "auth_revoked"
    NO_HEALTHY_ACCOUNT = "no_healthy_account"
    WORKSPACE_FAILED = "workspace_failed"
    UNREACHABLE = "unreachable"
    STUCK = "stuck"


class Action(enum.StrEnum):
    """What an outcome does to its job (the outcome table, herder.core.scheduling.policy)."""

    DONE = "done"
    RETRY = "retry"
    """Requeue after the rule's delay (or the budget's backoff)."""
    ESCALATE = "escalate"
    """Requeue at the next heavier weight; past the heaviest, fail."""
    WAIT = "wait"
    """Requeue when the attempt said work can resume (a quota's reset), else after the delay."""
    FAIL = "fail"
    CANCEL = "cancel"


class Budget(enum.StrEnum):
    """The counter an outcome spends."""

    ATTEMPTS = "attempts"
    TRANSIENT = "transient_attempts"
    SPAWN = "spawn_failures"
    LOST = "lost"
    NONE = "none"


JOB_OUTCOMES = frozenset({
    Outcome.OK, Outcome.FAILED, Outcome.TRANSIENT, Outcome.USAGE_BLOCKED,
    Outcome.NEEDS_HEAVIER, Outcome.OOM, Outcome.RAM_CONTENTION, Outcome.AUTH_REVOKED,
    Outcome.NO_HEALTHY_ACCOUNT, Outcome.WORKSPACE_FAILED, Outcome.UNREACHABLE,
})
"""What a job may say it ended in (its $HERDER_RESULT, its job type's exit-code map); the
rest (lost, timeout, cancelled, stuck ...) only herder can tell."""


class Enforcement(enum.StrEnum):
    """How an attempt's memory was kept within its weight's budget."""

    CGROUP_V2 = "cgroup-v2"
    CGROUP_V1 = "cgroup-v1"
    WATCHDOG = "watchdog"
    """Sampled RSS of the process tree; the tree is stopped past budget + margin."""
    OFF = "off"
    """Measured only."""


class MemoryUse(msgspec.Struct, frozen=True):
    """What an attempt's process tree used at its peak, against the budget it ran under."""

    peak_rss_bytes: int | None
    budget_bytes: int | None
    """The weight's budget; None when it has none (measured, never stopped)."""
    enforcement: Enforcement

    def describe(self) -> str:
        """`peak RSS 212 MB of budget 64 MB (enforced by cgroup-v1)`, for `herder show`."""
        def megabytes(count: int | None, unknown: str) -> str:
            return unknown if count is None else f"{count / 1024**2:.0f} MB"
        return (f"peak RSS {megabytes(self.peak_rss_bytes, 'unknown')} of budget "
                f"{megabytes(self.budget_bytes, 'none')} (enforced by {self.enforcement})")


class AttemptToken(msgspec.Struct, frozen=True):
    """The fence: every write about an attempt names the job and its attempt number."""

    job_id: int
    attempt: int

    def __str__(self) -> str:
        return f"{self.job_id}.{self.attempt}"


class WorkerId(msgspec.Struct, frozen=True):
    """A runner process: host label, pid and kernel start time (pids get reused)."""

    host: str
    pid: int
    start_time: int

    def __str__(self) -> str:
        return f"{self.host}/{self.pid}/{self.start_time}"

    @classmethod
    def parse(cls, text: str) -> WorkerId | None:
        parts = text.rsplit("/", 2)
        if len(parts) != 3:
            return None
        try:
            return cls(parts[0], int(parts[1]), int(parts[2]))
        except ValueError:
            return None
_DEFAULTS = DefaultsSection()


class JobSpec(msgspec.Struct, frozen=True):
    """A job as submitted: everything resolved, nothing decided by the store yet. `intake`
    resolves every field; what a caller in code leaves out is herder.toml's [defaults]."""

    command: tuple[str, ...]
    job_type: str = "adhoc"
    shell: bool = False
    payload: JSONObject = msgspec.field(default_factory=dict)
    priority: int = _DEFAULTS.priority
    weight: str = _DEFAULTS.weight
    dedup_key: str | None = None
    affinity: str | None = None
    available_at: datetime | None = None
    max_attempts: int = _DEFAULTS.max_attempts
    timeout_seconds: float | None = _DEFAULTS.timeout
    env: Mapping[str, str] = msgspec.field(default_factory=dict)
    workdir: str | None = None
    backoff_base_seconds: float = _DEFAULTS.backoff_base
    backoff_max_seconds: float = _DEFAULTS.backoff_max
    silence_timeout_seconds: float | None = None
    """No new log output for this long: the attempt is stopped as `stuck`."""


class Job(msgspec.Struct, frozen=True):
    id: int
    job_type: str
    command: tuple[str, ...]
    shell: bool
    payload: JSONObject
    priority: int
    weight: str
    dedup_key: str | None
    affinity: str | None
    available_at: datetime
    max_attempts: int
    timeout_seconds: float | None
    env: Mapping[str, str]
    workdir: str | None
    backoff_base_seconds: float
    backoff_max_seconds: float
    status: JobStatus
    attempt: int
    failures: int
    lost: int
    host: str | None
    exit_code: int | None
    failure_reason: str | None
    cancel_requested: bool
    created_at: datetime
    claimed_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    ram_gb: float = 0.0
    spawn_failures: int = 0
    transient_attempts: int = 0
    escalations: int = 0
    actionable: bool = False
    human_action: bool = False
    silence_timeout_seconds: float | None = None

    @property
    def token(self) -> AttemptToken:
        return AttemptToken(self.id, self.attempt)


class Attempt(msgspec.Struct, frozen=True):
    job_id: int
    attempt: int
    host: str
    worker: str
    pid: int | None
    log_path: str | None
    claimed_at: datetime
    started_at: datetime | None
    heartbeat_at: datetime
    ended_at: datetime | None
    exit_code: int | None
    outcome: Outcome | None
    memory: MemoryUse | None = None

    @property
    def token(self) -> AttemptToken:
        return AttemptToken(self.job_id, self.attempt)


class Event(msgspec.Struct, frozen=True):
    id: int
    job_id: int
    at: datetime
    kind: str
    from_status: JobStatus | None
    to_status: JobStatus | None
    attempt: int | None
    detail: JSONObject


def launch_errors(events: Sequence[Event]) -> dict[int, str]:
    """Attempt number -> why it could not start (the OS error its runner recorded on its
    `finished` event), for the attempts that never started."""
    return {event.attempt: str(event.detail["launch_error"]) for event in events
            if event.kind == "finished" and event.attempt is not None
            and event.detail.get("launch_error")}


def launch_failure(attempts: Sequence[Attempt], events: Sequence[Event]) -> str | None:
    """"its last attempt on H could not start: ERROR" when the job's last ended attempt
    never started; None otherwise (`herder why`)."""
    ended = [attempt for attempt in attempts if attempt.ended_at is not None]
    if not ended:
        return None
    last = max(ended, key=lambda attempt: attempt.attempt)
    error = launch_errors(events).get(last.attempt)
    return None if error is None else f"its last attempt on {last.host} could not start: {error}"


class Decision(msgspec.Struct, frozen=True):
    """What the policy decided for a job after an attempt ended."""

    status: JobStatus
    available_at: datetime | None = None
    failure_reason: str | None = None
    spend_failure: bool = False
    spend_lost: bool = False
    spend_spawn_failure: bool = False
    spend_transient: bool = False
    weight: str | None = None
    """The heavier weight the job moves to (an escalation), or None to keep its own."""
    avoid_host: bool = False
    """The next attempt should go elsewhere while another host can take it."""
    actionable: bool = False
    """A failure someone should look at (a code fault, a timeout), not weather."""
    human_action: bool = False
    """Only a human can fix it (a revoked login); retrying cannot."""
    note: str | None = None


class AttemptResult(msgspec.Struct, frozen=True):
    """An ended attempt and the decision for its job, applied by `attempt_finish`."""

    token: AttemptToken
    outcome: Outcome
    exit_code: int | None
    decision: Decision
    report: str | None = None
    """What else the attempt's end says (a JSON object: the verdict's source, evidence,
    cost, turns, the job's own result), added to its `finished` event."""
    memory: MemoryUse | None = None


class InsertResult(msgspec.Struct, frozen=True):
    """`created` is False when the dedup guard kept an existing job instead."""

    job_id: int
    created: bool
    status: JobStatus


class HeartbeatReply(msgspec.Struct, frozen=True):
    """Which of the beating attempts are still live, and which were asked to stop."""

    live: frozenset[AttemptToken]
    cancel: frozenset[AttemptToken]


class Transport(enum.StrEnum):
    LOCAL = "local"
    AGENT = "agent"
    SSH = "ssh"

    @property
    def pulls(self) -> bool:
        """An agent heartbeats for the host and asks for its work: an agent host, or a
        server's local host (served by a child agent)."""
        return self is not Transport.SSH


class HostRecord(msgspec.Struct, frozen=True):
    """A host as stored: its configuration plus its last heartbeat (never the token)."""

    label: str
    ram_total_gb: float
    ram_reserved_gb: float = 0.0
    cpus: int = 1
    enabled: bool = True
    transport: Transport = Transport.AGENT
    ssh_target: str | None = None
    prime_max_workers: int = 1
    prime_max_weight: str | None = None
    night_max_workers: int = 1
    night_max_weight: str | None = None
    allowed_job_types: frozenset[str] | None = None
    allowed_weights: frozenset[str] | None = None
    priority_floor: int | None = None
    labels: frozenset[str] = frozenset()
    last_heartbeat: datetime | None = None
    agent_info: JSONObject = msgspec.field(default_factory=dict)
    has_token: bool = False


class Scope(enum.StrEnum):
    """What an API token may do. admin > submit > read; agent is apart, bound to one host."""

    ADMIN = "admin"
    SUBMIT = "submit"
    READ = "read"
    AGENT = "agent"


class TokenRecord(msgspec.Struct, frozen=True):
    """An API token as stored: its scope and limits, never the token itself."""

    id: int
    name: str
    scope: Scope
    created_at: datetime
    host: str | None = None
    job_types: frozenset[str] | None = None
    priority_floor: int | None = None
    revoked_at: datetime | None = None
    allow_adhoc: bool = False
    """submit: may run ad-hoc commands (`--allow-adhoc`), a shell on every host."""


class ReservationKind(enum.StrEnum):
    SUBAGENT = "subagent"
    CI = "ci"


class ReservationStatus(enum.StrEnum):
    ACTIVE = "active"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RELEASED = "released"
    EXPIRED = "expired"


class Reservation(msgspec.Struct, frozen=True):
    """RAM booked on a host outside the job table, with a TTL."""

    id: int
    kind: ReservationKind
    owner: str
    host: str
    weight: str
    ram_gb: float
    status: ReservationStatus
    created_at: datetime
    expires_at: datetime
    ended_at: datetime | None
    created_by: int | None = None
    """The id of the token that made it; None for an admin without a stored token."""
    job_id: int | None = None
    """The job a subagent slot was booked for; None when none was named."""


class HostUsage(msgspec.Struct, frozen=True):
    """What is booked on a host now: active attempts and live reservations."""

    label: str
    workers: int
    jobs_gb: float
    reserved_gb: float

    @property
    def booked_gb(self) -> float:
        return self.jobs_gb + self.reserved_gb


RUNNER_PRESENCE_INTERVAL = 5.0
"""Seconds between two writes of a `herder up` runner's presence (`RunnerPresence`)."""


class RunnerPresence(msgspec.Struct, frozen=True):
    """A `herder up` runner as it last said, so its machine shows like a host (never placed
    on: it claims its own work). Written by its loop when its slots change, else every
    RUNNER_PRESENCE_INTERVAL."""

    label: str
    worker: str
    concurrency: int
    running: int
    """Its slots in use: the attempts it supervises."""
    cpus: int
    ram_total_gb: float
    ram_booked_gb: float
    """Its running attempts' memory budgets (their weights'), as placement would book them."""
    ram_available_gb: float | None
    """What the machine measured available (MemAvailable); None when it could not say."""
    started_at: datetime
    last_turn_at: datetime
    """When its loop last wrote this: an old one is a runner that died or froze. The
    database's clock stamps it and `Store.runner_list` moves it onto the reader's, so no
    runner's clock decides it (what a runner sends is ignored)."""


class Account(msgspec.Struct, frozen=True):
    """An account as declared: on which host, what it gives a job (`env`: empty when read
    back from the store's list, since its values may be secrets), how many sessions it takes
    at once, and which job types it serves (None: every type that asks for one)."""

    host: str
    name: str
    env: Mapping[str, str] = msgspec.field(default_factory=dict)
    max_sessions: int = 1
    job_types: frozenset[str] | None = None
    probe: tuple[str, ...] | None = None
    source: str = "config"

    def serves(self, job_type: str, names: frozenset[str] | None) -> bool:
        """Whether a job of `job_type`, which may use the accounts `names` (None: any),
        may run under this account."""
        return ((self.job_types is None or job_type in self.job_types)
                and (names is None or self.name in names))


class Usage(msgspec.Struct, frozen=True):
    """How much of its quota an account has used and when that resets, as its probe last
    said; None: unknown."""

    percent: float | None = None
    resets_at: datetime | None = None


class AccountHealth(msgspec.Struct, frozen=True):
    """What is known about an account's health; the defaults know nothing (healthy)."""

    depleted_until: datetime | None = None
    auth_revoked_at: datetime | None = None
    dead_token: bool | None = None
    """The last probe's verdict; None when no probe ran or it said nothing usable."""
    probed_at: datetime | None = None
    usage: Usage = Usage()


class AccountRecord(msgspec.Struct, frozen=True):
    """An account as stored: what it is (never its env's values), its health, and its
    sessions (the live attempts under it)."""

    account: Account
    health: AccountHealth
    sessions: int = 0
