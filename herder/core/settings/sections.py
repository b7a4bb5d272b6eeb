"""herder.toml's sections as frozen msgspec Structs, each owning its defaults: the runtime
and the pure core take theirs from a settings value, never from a number of their own. The
sections are plain data, cheap to import (every command loads them); the job types, the
fleet and its hosts, and the hooks have modules of their own."""

import re
from typing import Annotated, Any

from msgspec import Meta, Struct, field

from herder.core.settings.fields import (
    NAME,
    Duration,
    Invalid,
    env_name,
    names,
    one_of,
    pass_env_refusal,
    positive,
    rules,
)
from herder.core.settings.fleet import (
    DEFAULT_WEIGHTS,
    SEED_SUBAGENT_CAPS,
    FleetSection,
    HostSection,
)
from herder.core.settings.hooks import HooksSection
from herder.core.settings.job_defaults import DefaultsSection
from herder.core.settings.job_types import JobTypeSection


class HerderSection(Struct, frozen=True):
    """[herder]: where the database and the logs are, and this machine's label."""

    db: str | None = None
    log_dir: str = "herder-logs"
    host: str | None = None


def _pass_env_entry(entry: str) -> str:
    refusal = pass_env_refusal(entry)
    if refusal is not None:
        raise ValueError(refusal)
    return entry


def _nice(value: dict[str, int]) -> dict[str, int]:
    for weight, level in value.items():
        if not 0 <= level <= 19:
            raise ValueError(f"nice for {weight!r} is {level}; use 0 (normal) to 19 (lowest)")
    return value


class RuntimeSection(Struct, frozen=True):
    """[runtime]: how a runner runs attempts (`herder up`, agents, the server's local hosts)."""

    concurrency: Annotated[int, Meta(ge=1, le=1024)] = 4
    heartbeat_interval: Annotated[Duration, positive()] = 10.0
    attempt_lease: Duration = 60.0
    kill_grace: Duration = 10.0
    poll_interval: Annotated[Duration, positive()] = 1.0
    max_lost: Annotated[int, Meta(ge=1)] = 5
    """Lost attempts (runner crashes) before a job fails as lost."""
    pass_env: Annotated[list[str], rules(each=_pass_env_entry)] = field(default_factory=list)
    """Variables of the runner's environment a job gets besides the base allow-list."""
    fence_margin: Annotated[Duration | None, positive(
        " (or left out for a quarter of attempt_lease)")] = None
    """A runner whose heartbeats fail stops its attempts this long before their lease ends;
    None is a quarter of the lease."""
    workspace_root: str = "herder-workspaces"
    """Where attempts' workspaces and the worktree mirrors live; a relative path is beside
    the log folder."""
    workspace_keep_failed: Duration = 86400.0
    """A failed attempt's workspace is kept this long for inspection, then swept."""
    workspace_min_free_gb: Annotated[float, Meta(ge=0)] = 1.0
    """A workspace is not prepared when less than this is free on its disk."""
    memory_enforcement: Annotated[str, rules(check=one_of(
        ("auto", "cgroup", "watchdog", "off")))] = "auto"
    """auto: a cgroup per attempt where the host allows one, else the watchdog; cgroup:
    the same, warning when none can be made; watchdog: sampled RSS only; off: measured."""
    memory_margin: Annotated[float, Meta(ge=0, le=10)] = 0.10
    """An attempt is stopped past its weight's budget times (1 + margin)."""
    memory_sample_interval: Annotated[Duration, positive()] = 2.0
    """How often each attempt's process tree RSS is sampled."""
    cgroup_root: str | None = None
    """A writable cgroup directory for the attempts' cgroups (e.g. a delegated subtree);
    left out: found from this process's own cgroup."""
    nice: Annotated[dict[str, int], rules(check=_nice)] = field(default_factory=dict)
    """Weight -> the niceness its attempts run at, e.g. {light = 10}."""
    run_as: str | None = None
    """The unprivileged user a root runner starts jobs as (herder.runtime.job_user); left
    out, a root runner's jobs run as root (with a warning at start)."""
    adopt_grace: Duration = 10.0
    """How long a dead agent's guardian waits for the host's next agent to adopt its
    running attempts before it kills them and reports them lost; 0 kills at once."""


class ServerSection(Struct, frozen=True):
    """[server]: how `herder server` listens and authenticates."""

    listen: str = "127.0.0.1:8470"
    api_token_env: str = "HERDER_API_TOKEN"
    long_poll: Duration = 25.0
    tls_cert: str | None = None
    tls_key: str | None = None
    public_url: str | None = None
    """How remote hosts and browsers reach this server (ssh push; behind a proxy, the name a
    loopback server answers besides its own, and https makes the session cookie Secure);
    default http(s)://listen."""
    allow_plaintext: bool = False
    """Serve plain http off loopback, and let ssh push hosts call a plain http public_url
    (--allow-plaintext): only on a network you trust."""
    max_body_bytes: Annotated[int, Meta(ge=1024, le=1024**3)] = 1024 * 1024
    """Larger request bodies are refused with 413 (agents ship logs in 512 KiB chunks)."""
    metrics_public: bool = False
    """`GET /metrics` without a token (a scraper on a trusted network); by default it
    needs a read token, as every operator read does."""
    queue_recent: Annotated[int, Meta(ge=0, le=1000)] = 20
    """How many of the newest jobs `GET /queue` lists."""
    max_log_bytes: Annotated[int, Meta(ge=1024 * 1024, le=2**40)] = 1024**3
    """The most log bytes an agent may write for one attempt (413 beyond)."""
    max_reservations_per_token: Annotated[int, Meta(ge=0, le=100_000)] = 32
    """Active reservations and CI slots one non-admin token may hold at once."""
    max_reservation_weight: str | None = None
    """The heaviest weight (by RAM budget) a non-admin token may reserve or claim a slot
    with; left out: any."""


_ALERT_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://\S")


def _alert_url(value: str) -> str:
    """A URL's shape only: Apprise knows its schemes, but importing it (slow: bench/README.md)
    at every command's config load would slow scripts' `herder submit` loops, so the scheme
    is checked where alerts are sent (`herder.runtime.delivery.check_urls`). The error never
    echoes the URL: it may hold a token."""
    if not _ALERT_URL.match(value):
        raise ValueError("expected an Apprise URL like json://host/path or "
                         "discord://webhook_id/webhook_token")
    return value


class AlertsSection(Struct, frozen=True):
    """[alerts]: where alerts are sent (Apprise URLs) and how often."""

    urls: Annotated[list[str], rules(each=_alert_url)] = field(default_factory=list)
    """Apprise URLs (Discord, Slack, Telegram, mailto, json:// ...); they may hold secrets."""
    urls_env: Annotated[str | None, rules(check=env_name)] = None
    """An environment variable holding more URLs, separated by spaces or commas (keeps
    tokens out of herder.toml)."""
    window: Annotated[Duration, Meta(gt=0)] = 900.0
    """One message per alert key per window: a flapping cause sends one, and one when it
    clears."""
    max_per_hour: Annotated[int, Meta(ge=1)] = 30
    """Messages past this in an hour wait (across keys): a storm cannot flood a channel."""
    queue_size: Annotated[int, Meta(ge=1)] = 200
    """Messages waiting for delivery, per URL; past it the URL's oldest is dropped (logged
    and counted)."""
    retries: Annotated[int, Meta(ge=0)] = 3
    """Tries after the first for a URL that fails (a 5xx, a timeout)."""
    retry_backoff: Annotated[Duration, Meta(gt=0)] = 2.0
    """The first wait before a retry; doubled each time, up to a minute."""
    timeout: Annotated[Duration, Meta(gt=0)] = 10.0
    """A URL's connect and read timeout (a slow endpoint only delays its own sender thread)."""
    interval: Annotated[Duration, Meta(gt=0)] = 2.0
    """How often the leader looks for alerts to send."""
    scheduler_silence: Annotated[Duration, Meta(gt=0)] = 300.0
    """Alert when the scheduler has completed no cycle for this long."""
    oom_loop_count: Annotated[int, Meta(ge=2)] = 3
    oom_loop_window: Annotated[Duration, Meta(gt=0)] = 300.0
    """An OOM loop: this many needs_heavier/oom endings of one job within this window."""
    ram_low_gb: Annotated[float, Meta(ge=0)] = 4.0
    ram_low_for: Annotated[Duration, Meta(ge=0)] = 300.0
    """A RAM spike: a host's measured available RAM below `ram_low_gb` for `ram_low_for`
    (below 4 GB for 5 minutes by default); 0 GB turns it off."""
    agent_unreachable: Annotated[Duration, Meta(gt=0)] = 300.0
    """An agent that cannot reach its server (or whose token is refused) this long raises
    an alert: through its own [alerts] urls at once, and to the server once it is back."""

    def __repr__(self) -> str:
        """Every field but `urls`: they may hold tokens, and a repr can end up in a log."""
        shown = ", ".join(f"{name}={getattr(self, name)!r}"
                          for name in self.__struct_fields__ if name != "urls")
        return f"AlertsSection({shown})"


def _merge_weights(value: Any) -> Any:
    """[weights] adds to and overrides the defaults, so one entry cannot silently drop the
    others (and shrink the escalation chain); `name = false` removes a weight."""
    if not isinstance(value, dict):
        return value
    merged: dict[str, Any] = dict(DEFAULT_WEIGHTS)
    for name, budget in value.items():
        if budget is False:
            if name not in merged:
                raise Invalid(["weights", name], f"{name!r} is not a default weight, so "
                              "there is nothing to remove; delete this line")
            del merged[name]
        elif budget is True:
            raise Invalid(["weights", name], "a weight is a RAM budget in GB; use a number, "
                          "or false to remove a default weight")
        else:
            merged[name] = budget
    return merged


def _weights(value: dict[str, float]) -> dict[str, float]:
    if not value:
        raise ValueError("at least one weight is needed")
    for name, budget in value.items():
        if not NAME.match(name):
            raise ValueError(f"{name!r} is not a valid weight name")
        if budget < 0:
            raise ValueError(f"weight {name!r} has a negative RAM budget")
    return value


class Settings(Struct, frozen=True):
    """All of herder.toml, each section a Struct of its own."""

    herder: HerderSection = HerderSection()
    runtime: RuntimeSection = RuntimeSection()
    defaults: DefaultsSection = DefaultsSection()
    weights: Annotated[dict[str, float], rules(before=_merge_weights, check=_weights)] = field(
        default_factory=lambda: dict(DEFAULT_WEIGHTS))
    job_types: Annotated[dict[str, JobTypeSection], rules(
        check=names(NAME, "{name!r} is not a valid job type name"))] = field(default_factory=dict)
    fleet: FleetSection = FleetSection()
    server: ServerSection = ServerSection()
    alerts: AlertsSection = AlertsSection()
    hosts: Annotated[dict[str, HostSection], rules(
        check=names(NAME, "{name!r} is not a valid host label"))] = field(default_factory=dict)
    hooks: HooksSection = HooksSection()


def subagent_caps(settings: Settings) -> dict[str, int]:
    """Weight -> the subagent slots one job of it may hold on a host: the defaults, for the
    weights these settings define, with [fleet] max_subagents_for_weight over them; a
    weight without an entry (or with false) has no cap."""
    caps: dict[str, int | bool] = {name: cap for name, cap in SEED_SUBAGENT_CAPS.items()
                                   if name in settings.weights}
    caps.update(settings.fleet.max_subagents_for_weight)
    return {name: int(cap) for name, cap in caps.items() if cap is not False}


DEFAULTS = Settings()
"""herder.toml with no key set: where a default of the runtime or the pure core is read
(`DEFAULTS.fleet.breaker_pause`), never a number of its own. A Struct's class attribute is
its field's slot, not its default, hence a value."""
