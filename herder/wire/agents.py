"""The agent protocol (`/api/v1/agent/…`): heartbeat, claim, start, adopt, finish, log and
trouble reports, as the server and the agent both read them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import AwareDatetime, Field, ValidationInfo, field_validator

from herder.core.job_result import Seconds
from herder.core.model import (
    INT_MAX,
    AttemptToken,
    Enforcement,
    Job,
    JobStatus,
    MemoryUse,
    Outcome,
)
from herder.wire.base import (
    AttemptNumber,
    Body,
    Bytes,
    Int32,
    JobNumber,
    Reply,
    Timestamp,
)

TokenPair = tuple[int, int]
"""An attempt on the wire: [job id, attempt number]."""


def pairs(tokens: Any) -> list[TokenPair]:
    """Attempt tokens as sorted [job id, attempt] pairs."""
    return sorted((token.job_id, token.attempt) for token in tokens)


def tokens(pairs_: list[TokenPair]) -> frozenset[AttemptToken]:
    return frozenset(AttemptToken(job_id, attempt) for job_id, attempt in pairs_)


class HeartbeatBody(Body):
    worker: str = Field(max_length=400)
    running: list[tuple[JobNumber, AttemptNumber]] = Field(default_factory=list,
                                                           max_length=100_000)
    info: dict[str, Any] = Field(default_factory=dict)
    with_attempts: bool = False
    """Also list every live attempt of the host (an agent asks once, when it starts)."""


class PreflightCheck(Reply):
    """A job type's preflight (`herder.runtime.preflight.Check`)."""

    argv: list[str]
    strict: bool
    timeout: float
    cache: float = 45.0
    """Seconds its result stands (`preflight_cache`)."""


class AccountProbe(Reply):
    """An account's probe as the host's agent runs it (`herder.runtime.accounts`)."""

    argv: list[str]
    timeout: float
    interval: float


class HostGate(Reply):
    """What an agent needs to gate itself before taking work."""

    label: str
    enabled: bool
    window: str
    max_workers: int
    max_weight: str | None
    allowed_job_types: list[str] | None
    allowed_weights: list[str] | None
    priority_floor: int | None
    weights: dict[str, float]
    escalation: list[str]
    preflight: dict[str, PreflightCheck] = Field(default_factory=dict)
    """Job type -> the check the agent runs before taking that type."""
    probes: dict[str, AccountProbe] = Field(default_factory=dict)
    """Account -> the probe the agent runs on the host; it reports `accounts` in its
    heartbeat's info as account -> dead_token (true, false, or null for unknown)."""


class CheckedJobType(Reply):
    """A job type allowed on a host, as `herder doctor --agent` checks it there."""

    preflight: PreflightCheck | None
    """None: `preflight = false`, or a shell command whose program herder does not guess."""
    workspace: bool
    """It checks out a workspace: the host needs git."""


class HostChecks(Reply):
    """What `herder doctor --agent` runs on one host, from the server's herder.toml and store
    (`GET /api/v1/agent/{label}/checks`): the job types allowed there and its accounts'
    probes. Commands and timings only: never an account's variables or a token."""

    label: str
    job_types: dict[str, CheckedJobType]
    probes: dict[str, AccountProbe]


class HeartbeatReply(Reply):
    live: list[TokenPair]
    """Of the attempts the agent named, those still live on this host."""
    cancel: list[TokenPair]
    """Of those, the ones an operator asked to stop."""
    host: HostGate | None
    attempts: list[tuple[int, int, str]] = Field(default_factory=list)
    """With `with_attempts`: every live attempt on the host and its runner, so a restarted
    agent can report what its dead predecessor was running."""
    lease_seconds: float | None = None
    """The lease the server enforces: the agent fences itself before it runs out."""


class Gone(Reply):
    lost: int
    host_stopped: int
    handed_back: int


class Assignment(Reply):
    """A placed attempt as an agent receives it: everything it needs to run the job."""

    id: int
    attempt: int
    job_type: str
    command: list[str]
    shell: bool
    payload: dict[str, Any]
    priority: int
    weight: str
    ram_gb: float
    env: dict[str, str]
    workdir: str | None
    timeout_seconds: float | None
    max_attempts: int
    failures: int
    lost: int
    spawn_failures: int
    backoff_base_seconds: float
    backoff_max_seconds: float
    available_at: Timestamp | None = None
    created_at: Timestamp | None = None
    updated_at: Timestamp | None = None
    silence_timeout_seconds: float | None = None
    transient_attempts: int = 0
    escalations: int = 0

    def job(self, now: datetime) -> Job:
        """The claimed job the agent runs; a missing time is taken as `now`."""
        return Job(
            id=self.id, job_type=self.job_type, command=tuple(self.command), shell=self.shell,
            payload=self.payload, priority=self.priority, weight=self.weight, dedup_key=None,
            affinity=None, available_at=self.available_at or now,
            max_attempts=self.max_attempts, timeout_seconds=self.timeout_seconds,
            env=self.env, workdir=self.workdir, backoff_base_seconds=self.backoff_base_seconds,
            backoff_max_seconds=self.backoff_max_seconds, status=JobStatus.CLAIMED,
            attempt=self.attempt, failures=self.failures, lost=self.lost, host=None,
            exit_code=None, failure_reason=None, cancel_requested=False,
            created_at=self.created_at or now, claimed_at=None, started_at=None,
            finished_at=None, updated_at=self.updated_at or now, ram_gb=self.ram_gb,
            spawn_failures=self.spawn_failures, transient_attempts=self.transient_attempts,
            escalations=self.escalations, silence_timeout_seconds=self.silence_timeout_seconds)


class Assignments(Reply):
    jobs: list[Assignment]
    lease_seconds: float | None = None
    """The lease the server enforces, known before the first heartbeat: a runner that
    starts an attempt fences (and tells its guardian) by it from the start."""


class PlacedAttempt(Reply):
    """One attempt placed on the host (`herder run-attempt`); None when it is not."""

    job: Assignment | None
    lease_seconds: float | None = None


class StartBody(Body):
    pid: int = Field(ge=0, le=INT_MAX)
    log_path: str | None = Field(default=None, max_length=4096)


class Started(Reply):
    accepted: bool


class AdoptBody(Body):
    """A new agent takes over an attempt of its host's dead agent `previous`."""

    worker: str = Field(max_length=400)
    previous: str = Field(max_length=400)


class Adopted(Reply):
    log_size: int
    """The server's copy of the attempt's log, in bytes: shipping resumes from here."""


LOG_TAIL_CHARS = 16 * 1024


RESULT_CHARS = 64 * 1024


def storable_text(text: str) -> str:
    """Text a job wrote, as the wire can carry it: NUL characters (which PostgreSQL cannot
    store) become U+FFFD."""
    return text.replace("\x00", "\ufffd")


class FinishBody(Body):
    outcome: Outcome
    exit_code: Int32 | None = None
    retry_after: Seconds | None = None
    detail: str | None = Field(default=None, max_length=10_000)
    """What the agent says of the ending: why it refused the job, and for `launch_failed`
    the OS error that kept it from starting (recorded as the attempt's `launch_error`)."""
    log_tail: str | None = Field(default=None, max_length=LOG_TAIL_CHARS)
    """The end of the attempt's log, for the server to classify the ending."""
    result: str | None = Field(default=None, max_length=RESULT_CHARS + 1)
    """The job's $HERDER_RESULT as it wrote it (the server validates it)."""
    peak_rss_bytes: Bytes | None = None
    """The attempt's process tree at its peak; the memory fields are left out by agents
    older than them (the attempt then shows as not measured)."""
    memory_budget_bytes: Bytes | None = None
    memory_enforcement: Enforcement | None = None

    def memory(self) -> MemoryUse | None:
        if self.memory_enforcement is None:
            return None
        return MemoryUse(self.peak_rss_bytes, self.memory_budget_bytes,
                         self.memory_enforcement)

    @classmethod
    def memory_fields(cls, use: MemoryUse | None) -> dict[str, Any]:
        if use is None:
            return {}
        return {"peak_rss_bytes": use.peak_rss_bytes,
                "memory_budget_bytes": use.budget_bytes,
                "memory_enforcement": use.enforcement}


class Finished(Reply):
    accepted: bool
    status: JobStatus


class Cancels(Reply):
    cancel: list[TokenPair]


class LogWritten(Reply):
    size: int
    """The server's copy of the log, in bytes, after this chunk."""


class PushHeartbeat(Reply):
    ok: bool


class TroubleBody(Body):
    """`POST /api/v1/agent/{label}/trouble`: an agent back from trouble with its server says
    what it was (herder.core.scheduling.alerting.Trouble): the server raises it as the alert
    `agent:<label>:<kind>`, or only records it when the agent's own alert URLs sent it."""

    kind: Literal["unreachable", "token_refused"]
    since: AwareDatetime
    until: AwareDatetime
    problem: str = Field(max_length=300)
    delivered: bool = False
    """The agent's own [alerts] urls took the alert while the server could not."""

    @field_validator("until")
    @classmethod
    def _after_since(cls, value: AwareDatetime, info: ValidationInfo) -> AwareDatetime:
        since = info.data.get("since")
        if since is not None and value < since:
            raise ValueError("until must not be before since")
        return value


class TroubleRecorded(Reply):
    key: str
    raised: bool
    """True: left open for the server's alert delivery; False: recorded only."""

