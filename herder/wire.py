"""The HTTP API's contract: every request and response body, as pydantic models.

The server validates requests and declares responses with them (so the OpenAPI document
shows real schemas); the agent parses what it receives with them; the Python client submits
with the same model. Only pydantic and `herder.core.model` are imported, so an agent or a client
does not pull in FastAPI or the server.

Requests are strict (unknown fields, NUL characters, non-finite numbers and out-of-range
ints are refused: PostgreSQL cannot store them); replies ignore fields they do not know,
so a newer server can add one without breaking an agent.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictInt,
    ValidationInfo,
    field_validator,
)

from herder.core.model import (
    BIGINT_MAX,
    INT_MAX,
    INT_MIN,
    JOB_OUTCOMES,
    Attempt,
    AttemptToken,
    Enforcement,
    Event,
    Job,
    JobStatus,
    MemoryUse,
    Outcome,
    ReservationStatus,
    Transport,
)
from herder.core.settings.fields import MAX_DURATION
from herder.core.submission import (
    DEDUP_KEY_LENGTH,
    NAME_LENGTH,
    WORKDIR_LENGTH,
    storable,
)

if TYPE_CHECKING:
    from herder.host_settings import HostSettings

Timestamp = Annotated[datetime, PlainSerializer(datetime.isoformat, return_type=str,
                                                       when_used="json")]
"""Written as `datetime.isoformat()` (`+00:00`, not pydantic's `Z`), as before the models."""
Seconds = Annotated[float, Field(ge=0, le=MAX_DURATION, allow_inf_nan=False)]
Int32 = Annotated[int, Field(ge=INT_MIN, le=INT_MAX)]
Bytes = Annotated[int, Field(ge=0, le=BIGINT_MAX)]
JobNumber = Annotated[int, Field(ge=1, le=BIGINT_MAX)]
AttemptNumber = Annotated[int, Field(ge=1, le=INT_MAX)]
TokenPair = tuple[int, int]
"""An attempt on the wire: [job id, attempt number]."""


def pairs(tokens: Any) -> list[TokenPair]:
    """Attempt tokens as sorted [job id, attempt] pairs."""
    return sorted((token.job_id, token.attempt) for token in tokens)


def tokens(pairs_: list[TokenPair]) -> frozenset[AttemptToken]:
    return frozenset(AttemptToken(job_id, attempt) for job_id, attempt in pairs_)


class Body(BaseModel):
    """A request body: strict (no unknown fields), and every field storable."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        problem = storable(value, depth=1)
        if problem:
            raise ValueError(problem)
        return value


class Reply(BaseModel):
    """A response body: fields a reader does not know are ignored. Built on first use, so
    a command that imports this module for the submit body pays for no reply model."""

    model_config = ConfigDict(extra="ignore", defer_build=True)


# -- operators: jobs -------------------------------------------------------------------------


class SubmitBody(Body):
    """A job to submit over HTTP: the fields of `herder.core.submission.SubmitRequest` (what the
    client and the CLI build), with their limits checked at the edge."""

    job_type: str | None = Field(default=None, max_length=NAME_LENGTH)
    command: list[str] | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    priority: Int32 | None = None
    weight: str | None = Field(default=None, max_length=NAME_LENGTH)
    dedup_key: str | None = Field(default=None, max_length=DEDUP_KEY_LENGTH)
    force: bool = False
    affinity: str | None = Field(default=None, max_length=NAME_LENGTH)
    delay_seconds: Seconds | None = None
    max_attempts: int | None = Field(default=None, ge=1, le=INT_MAX)
    timeout_seconds: Annotated[float, Field(gt=0, le=MAX_DURATION,
                                            allow_inf_nan=False)] | None = None
    workdir: str | None = Field(default=None, max_length=WORKDIR_LENGTH)
    env: dict[str, str] = Field(default_factory=dict)


class Submitted(Reply):
    """`created` is False when a job with the same dedup key already held it."""

    id: int
    created: bool
    status: JobStatus


class JobView(Reply):
    id: int
    status: JobStatus
    job_type: str
    priority: int
    weight: str
    attempt: int
    max_attempts: int
    failures: int
    lost: int
    spawn_failures: int = 0
    transient_attempts: int = 0
    escalations: int = 0
    host: str | None
    exit_code: int | None
    failure_reason: str | None
    actionable: bool = False
    """A failure someone should look at (a code fault, a timeout), not weather."""
    human_action: bool = False
    """Only a human can fix it (a revoked login)."""
    dedup_key: str | None
    affinity: str | None
    command: list[str]
    payload: dict[str, Any]
    workdir: str | None
    timeout_seconds: float | None
    cancel_requested: bool
    available_at: Timestamp
    created_at: Timestamp
    claimed_at: Timestamp | None
    started_at: Timestamp | None
    finished_at: Timestamp | None
    updated_at: Timestamp

    @classmethod
    def of(cls, job: Job) -> JobView:
        return cls(
            id=job.id, status=job.status, job_type=job.job_type, priority=job.priority,
            weight=job.weight, attempt=job.attempt, max_attempts=job.max_attempts,
            failures=job.failures, lost=job.lost, spawn_failures=job.spawn_failures,
            transient_attempts=job.transient_attempts, escalations=job.escalations,
            host=job.host, exit_code=job.exit_code, failure_reason=job.failure_reason,
            actionable=job.actionable, human_action=job.human_action,
            dedup_key=job.dedup_key, affinity=job.affinity,
            command=list(job.command), payload=dict(job.payload), workdir=job.workdir,
            timeout_seconds=job.timeout_seconds, cancel_requested=job.cancel_requested,
            available_at=job.available_at, created_at=job.created_at,
            claimed_at=job.claimed_at, started_at=job.started_at,
            finished_at=job.finished_at, updated_at=job.updated_at)


class AttemptView(Reply):
    attempt: int
    host: str
    worker: str
    pid: int | None
    log_path: str | None
    claimed_at: Timestamp
    started_at: Timestamp | None
    heartbeat_at: Timestamp
    ended_at: Timestamp | None
    exit_code: int | None
    outcome: Outcome | None
    peak_rss_bytes: int | None = None
    memory_budget_bytes: int | None = None
    memory_enforcement: Enforcement | None = None
    """How its memory was enforced; None when it was not measured (an older runner)."""

    @classmethod
    def of(cls, attempt: Attempt) -> AttemptView:
        return cls(
            attempt=attempt.attempt, host=attempt.host, worker=attempt.worker, pid=attempt.pid,
            log_path=attempt.log_path, claimed_at=attempt.claimed_at,
            started_at=attempt.started_at, heartbeat_at=attempt.heartbeat_at,
            ended_at=attempt.ended_at, exit_code=attempt.exit_code, outcome=attempt.outcome,
            **FinishBody.memory_fields(attempt.memory))


class EventView(Reply):
    id: int
    at: Timestamp
    kind: str
    from_status: JobStatus | None
    to_status: JobStatus | None
    attempt: int | None
    detail: dict[str, Any]

    @classmethod
    def of(cls, event: Event) -> EventView:
        return cls(id=event.id, at=event.at, kind=event.kind, from_status=event.from_status,
                   to_status=event.to_status, attempt=event.attempt, detail=dict(event.detail))


class JobDetail(JobView):
    """One job with its attempts and its whole event history, and what its last ended
    attempt said: its outcome, the job's own result ($HERDER_RESULT) and its cost."""

    outcome: Outcome | None = None
    result: dict[str, Any] | None = None
    cost_usd: float | None = None
    launch_error: str | None = None
    """Why its last ended attempt could not start (the OS error), if it could not."""
    attempts: list[AttemptView]
    events: list[EventView]

    @classmethod
    def of_history(cls, job: Job, attempts: Sequence[Attempt], events: Sequence[Event]
           ) -> JobDetail:
        finished = [e for e in events if e.kind == "finished"]
        last = dict(finished[-1].detail) if finished else {}
        ended = [a for a in attempts if a.outcome is not None]
        result = last.get("result")
        cost = last.get("cost_usd")
        launch = last.get("launch_error")
        return cls(**dict(JobView.of(job)),
                   outcome=ended[-1].outcome if ended else None,
                   result=result if isinstance(result, dict) else None,
                   cost_usd=cost if isinstance(cost, int | float) else None,
                   launch_error=launch if isinstance(launch, str) else None,
                   attempts=[AttemptView.of(attempt) for attempt in attempts],
                   events=[EventView.of(event) for event in events])


class Why(Reply):
    id: int
    why: str


class Cancelled(Reply):
    """The job's status once the cancel was recorded (a running job stops soon after)."""

    id: int
    status: JobStatus


class Retried(Reply):
    """`retried` is False when the job was not done, failed or cancelled (`status` says)."""

    id: int
    retried: bool
    status: JobStatus


class HostSwitched(Reply):
    """A host drained or enabled by an operator."""

    label: str
    enabled: bool


Name = Annotated[str, Field(max_length=NAME_LENGTH)]
Gigabytes = Annotated[float, Field(ge=0, le=1_000_000, allow_inf_nan=False)]


class HostSettingsBody(Body):
    """`herder host set`'s options (`herder.host_settings.HostSettings`); a field left out
    is left as it is. `job_types` / `weights` empty: any."""

    ram_total_gb: Gigabytes | None = None
    ram_reserved_gb: Gigabytes | None = None
    cpus: int | None = Field(default=None, ge=1, le=INT_MAX)
    transport: Transport | None = None
    ssh_target: Name | None = None
    prime_workers: int | None = Field(default=None, ge=0, le=INT_MAX)
    prime_max_weight: Name | None = None
    night_workers: int | None = Field(default=None, ge=0, le=INT_MAX)
    night_max_weight: Name | None = None
    job_types: list[Name] | None = Field(default=None, max_length=1000)
    weights: list[Name] | None = Field(default=None, max_length=1000)
    priority_floor: Int32 | None = None
    labels: list[Name] | None = Field(default=None, max_length=1000)

    def settings(self) -> HostSettings:
        from herder.host_settings import HostSettings

        sets = {key: None if value is None else frozenset(value)
                for key, value in (("job_types", self.job_types), ("weights", self.weights),
                                   ("labels", self.labels))}
        scalars = set(HostSettingsBody.model_fields) - set(sets)  # not HostAddBody's own
        return HostSettings(**{**self.model_dump(include=scalars), **sets})

    @classmethod
    def body_of(cls, settings: HostSettings) -> dict[str, Any]:
        """The JSON body for `settings`: only the fields given."""
        from msgspec.structs import asdict

        return {key: sorted(value) if isinstance(value, frozenset) else value
                for key, value in asdict(settings).items() if value is not None}


class HostAddBody(HostSettingsBody):
    label: str = Field(max_length=NAME_LENGTH)
    enabled: bool = True


class HostToken(Reply):
    """A host's new agent token: shown in this answer only (the server keeps its hash)."""

    label: str
    token: str


class HostChanged(Reply):
    label: str


class AccountBody(Body):
    """`herder account add`'s options; the server validates them as the CLI does."""

    env: dict[Name, Annotated[str, Field(max_length=10_000)]] = Field(default_factory=dict,
                                                                      max_length=1000)
    max_sessions: Int32 = 1
    job_types: list[Name] | None = Field(default=None, max_length=1000)
    probe: list[Annotated[str, Field(max_length=10_000)]] | None = Field(default=None,
                                                                         max_length=1000)


class AccountChanged(Reply):
    host: str
    name: str
    changed: bool
    """add: always; clear: False when it was healthy already."""


class DedupHolder(Reply):
    """`herder should-dispatch`: the job holding a dedup key, or none (dispatch)."""

    key: str
    job_id: int | None = None
    status: JobStatus | None = None


class DispatchCheckBody(Body):
    """`herder should-dispatch KEY --type T -p field=value`: run T's dispatch_check (its
    values are checked again by `herder.dispatch_check.check_payload`)."""

    job_type: str = Field(min_length=1, max_length=NAME_LENGTH)
    dedup_key: str = Field(min_length=1, max_length=DEDUP_KEY_LENGTH, pattern=r"^[^\x00]*$")
    payload: dict[str, str] = Field(default_factory=dict, max_length=64)


class DispatchChecked(Reply):
    """The check's word: skip (with its reason), dispatch, or `error` (it failed)."""

    skip: bool = False
    reason: str | None = None
    error: str | None = None


class AccountView(Reply):
    """An account as `herder accounts` shows it: never its environment's values."""

    host: str
    name: str
    state: str
    detail: str
    sessions: int
    max_sessions: int
    job_types: list[str] | None
    source: str
    depleted_until: Timestamp | None
    auth_revoked_at: Timestamp | None
    dead_token: bool | None
    usage_percent: float | None = None
    """The share of its quota used, as its probe last said (None: unknown)."""
    usage_resets_at: Timestamp | None = None


class AlertView(Reply):
    id: int
    key: str
    message: str
    opened_at: Timestamp
    cleared_at: Timestamp | None
    sent_at: Timestamp | None = None
    """When its opening went to the delivery queue (None: not sent, or held back)."""
    resolved_sent_at: Timestamp | None = None
    sent_count: int = 0


# -- operators: hosts and health -------------------------------------------------------------


class WindowView(Reply):
    max_workers: int
    max_weight: str | None


class HostView(Reply):
    label: str
    enabled: bool
    agent: str | None
    """"stopped" or "draining" as its agent last said; None when it takes work."""
    transport: str
    health: str
    last_heartbeat: Timestamp | None
    agent_down: str | None
    """Why its agent is not live for placement (missed heartbeats); None when it is."""
    condition: str | None = None
    """"enabled", "drained" (`herder host drain`), "agent draining" or "agent stopped":
    the words `herder why` uses. None from a server older than the field."""
    liveness: str | None = None
    """By placement's rule: live, late (missed a heartbeat), down, stopped or unknown."""
    missed_heartbeats: int = 0
    heartbeat_age_seconds: float | None = None
    """Seconds since its last heartbeat when the view was made."""
    ram_total_gb: float
    ram_reserved_gb: float
    bookable_gb: float
    booked_gb: float
    free_gb: float
    cpus: int
    workers: int
    window: str
    max_workers: int
    max_weight: str | None
    prime: WindowView
    night: WindowView
    allowed_job_types: list[str] | None
    allowed_weights: list[str] | None
    priority_floor: int | None
    labels: list[str]
    ssh_target: str | None
    measured_available_gb: float | None = None
    """RAM its agent last measured available (`MemAvailable`); None with no agent."""
    breakers: dict[str, str] = Field(default_factory=dict)
    """Job type -> its circuit breaker on this host, where it is not closed."""
    preflight_failed: dict[str, str] = Field(default_factory=dict)
    """Job type -> why its preflight failed on this host (its agent's last word)."""


class LoopView(Reply):
    ok: bool
    age_seconds: float
    stale_after_seconds: float
    failures: int
    last_error: str | None
    ended: bool


class Health(Reply):
    """`/healthz`: ok only while every loop of the server has had a recent good cycle."""

    ok: bool
    leader: bool
    fatal: str | None
    loops: dict[str, LoopView]


# -- the agent protocol ------------------------------------------------------------------------


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

    @classmethod
    def of(cls, job: Job) -> Assignment:
        return cls(
            id=job.id, attempt=job.attempt, job_type=job.job_type, command=list(job.command),
            shell=job.shell, payload=dict(job.payload), priority=job.priority,
            weight=job.weight, ram_gb=job.ram_gb, env=dict(job.env), workdir=job.workdir,
            timeout_seconds=job.timeout_seconds, max_attempts=job.max_attempts,
            failures=job.failures, lost=job.lost, spawn_failures=job.spawn_failures,
            backoff_base_seconds=job.backoff_base_seconds,
            backoff_max_seconds=job.backoff_max_seconds, available_at=job.available_at,
            created_at=job.created_at, updated_at=job.updated_at,
            silence_timeout_seconds=job.silence_timeout_seconds,
            transient_attempts=job.transient_attempts, escalations=job.escalations)

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


class JobResult(Body):
    """What a job may write to `$HERDER_RESULT` (a JSON object) to say how it ended; it wins
    over the exit code and the log. Unknown fields make it invalid (a typo must not pass as
    a claim)."""

    summary: str | None = Field(default=None, max_length=4000)
    outcome: Outcome | None = None
    failure_reason: str | None = Field(default=None, max_length=100,
                                       pattern=r"^[a-z][a-z0-9_]*$")
    """Recorded as the job's failure_reason, e.g. mutex_collision or stale_duplicate."""
    cost_usd: float | None = Field(default=None, ge=0, le=1e9, allow_inf_nan=False)
    turns: int | None = Field(default=None, ge=0, le=INT_MAX)
    links: list[Annotated[str, Field(max_length=2000)]] = Field(default_factory=list,
                                                              max_length=50)
    retry_after: Seconds | None = None
    resume_at: datetime | None = None
    """When the job can run again (a quota's reset it saw); timezone-aware."""

    @field_validator("outcome")
    @classmethod
    def _claimable(cls, value: Outcome | None) -> Outcome | None:
        if value is not None and value not in JOB_OUTCOMES:
            raise ValueError(f"{value} is herder's to say; a job may claim one of "
                             f"{', '.join(sorted(JOB_OUTCOMES))}")
        return value

    @field_validator("resume_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("give a timezone, e.g. 2026-12-01T15:00:00+01:00")
        return value


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


# -- reservations and CI slots -----------------------------------------------------------------


class ReserveBody(Body):
    owner: str = Field(min_length=1, max_length=200)
    host: str = Field(max_length=200)
    count: int = Field(ge=1, le=1000)
    weight: str = Field(default="subagent", max_length=200)
    job: int | None = Field(default=None, ge=1, le=BIGINT_MAX)
    """The running job that books them: its weight caps them (max_subagents_for_weight)."""


class Reserved(Reply):
    reserved: list[int]
    """The ids of the slots that fit (maybe fewer than requested)."""
    requested: int


class CompleteBody(Body):
    status: ReservationStatus


class ReservationEnded(Reply):
    id: int
    status: ReservationStatus


class SlotBody(Body):
    run_id: str = Field(min_length=1, max_length=200)
    host: str | None = Field(default=None, max_length=200)
    weight: str | None = Field(default=None, max_length=200)


class SlotClaimed(Reply):
    id: int
    run_id: str
    host: str


class SlotReleased(Reply):
    released: bool


class HookReply(Reply):
    """What a webhook delivery did: `enqueued` (202; `created` are the new jobs, the rest
    were held by their dedup keys), `duplicate` (200: seen before, nothing changed;
    `jobs` are what it enqueued then), `ignored` (202: no rule matched) or `pong`."""

    outcome: str
    delivery: str | None = None
    jobs: list[int] = []
    created: list[int] = []


# -- operators: the queue at a glance (`GET /queue`) -------------------------------------------


class QueueJob(Reply):
    """A recent job, short: what a glance at the queue needs (`/api/v1/jobs/{id}` has all)."""

    id: int
    status: JobStatus
    job_type: str
    host: str | None
    attempt: int
    priority: int
    weight: str
    failure_reason: str | None
    actionable: bool
    created_at: Timestamp
    updated_at: Timestamp

    @classmethod
    def of(cls, job: Job) -> QueueJob:
        return cls(id=job.id, status=job.status, job_type=job.job_type,
                   priority=job.priority, weight=job.weight, attempt=job.attempt,
                   host=job.host, failure_reason=job.failure_reason,
                   actionable=job.actionable, created_at=job.created_at,
                   updated_at=job.updated_at)


class QueueAccount(Reply):
    host: str
    name: str
    state: str
    detail: str
    sessions: int
    max_sessions: int


class QueueAlert(Reply):
    key: str
    message: str
    opened_at: Timestamp


class Resilience(Reply):
    """Seed 002's `/queue.resilience`: what holds work back besides capacity."""

    breakers: dict[str, dict[str, str]]
    """Host -> job type -> its circuit breaker, where it is not closed."""
    preflight_failed: dict[str, dict[str, str]]
    """Host -> job type -> why its preflight failed there."""


class FleetCapView(Reply):
    """`[fleet] emergency_max_workers` now: the fleet-wide cap on running jobs (None: no
    cap), whether an operator set it at run time (else herder.toml's), and the jobs
    running (claimed or running) against it."""

    max_workers: int | None
    at_run_time: bool = False
    updated_at: Timestamp | None = None
    updated_by: str | None = None
    running: int = 0


class FleetCapBody(Body):
    """`PUT /api/v1/fleet/cap`: a cap (a whole number, 0 or more), or null to lift it."""

    max_workers: Annotated[StrictInt, Field(ge=0, le=INT_MAX)] | None


class QueueView(Reply):
    """`GET /queue`: counts by status, the newest jobs, each host's slots and RAM, what
    holds work back (breakers, preflight, accounts) and the open alerts."""

    counts: dict[str, int]
    """Every status, zero included."""
    recent: list[QueueJob]
    hosts: list[HostView]
    resilience: Resilience
    accounts: list[QueueAccount]
    alerts: list[QueueAlert]
    leader: bool
    """Whether the replica that answered is the scheduler's leader."""
    capacity_ratio: float = 1.0
    """Seed 003's share of the enabled slots on hosts accepting work."""
    shed_max_weight: str | None = None
    """The heaviest weight placement still starts at that ratio ([fleet] shedding)."""
    spawn_failures: dict[str, dict[str, int]] = Field(default_factory=dict)
    """Host -> outcome -> attempts that failed to start there in the last hour."""
    fleet_cap: FleetCapView | None = None


# -- the dashboard ----------------------------------------------------------------------------


class JobRow(QueueJob):
    """A row of the dashboard's jobs view: a queued job says why it waits (`herder why`)."""

    dedup_key: str | None
    max_attempts: int
    why: str | None = None

    @classmethod
    def of_row(cls, job: Job, why: str | None) -> JobRow:
        return cls(**QueueJob.of(job).model_dump(), dedup_key=job.dedup_key,
                   max_attempts=job.max_attempts, why=why)


class JobPage(Reply):
    """`GET /api/v1/dashboard/jobs`: one page, newest first; `next_before` asks for the
    next (older) page, None on the last."""

    jobs: list[JobRow]
    next_before: int | None


class SessionView(Reply):
    """`GET /api/v1/dashboard/session`: who the dashboard's caller is and what it may do;
    `csrf` is the value a state-changing request sends in `X-Herder-CSRF` (signed in with a
    cookie only)."""

    name: str
    scope: str
    can_submit: bool
    can_admin: bool
    csrf: str | None
