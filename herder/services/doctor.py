"""`herder doctor`'s checks: what this machine needs for its role, each checked at once
and each within a time limit.

Every check runs in a daemon thread of its own; the doctor waits for all of them until
one shared deadline, and a check still running then is reported as a problem
(`diagnosis.timed_out`) and left behind: it never blocks the others, and the process
exits without it. The results are herder.core.diagnosis's findings, in the order the
checks were listed; no finding holds a secret (a database URL is printed redacted).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from herder.core.diagnosis import Finding, ok, problem, timed_out, warning
from herder.core.errors import InputError
from herder.core.programs import find_program
from herder.core.urls import loopback_name, redact_url, redact_urls_in

if TYPE_CHECKING:
    from herder.core.settings.loading import Config
    from herder.runtime.accounts import ProbeCommand
    from herder.runtime.agent_client import ServerClient
    from herder.runtime.preflight import Check as PreflightCommand
    from herder.store import Store

CHECK_TIMEOUT = 10.0
"""Seconds every check has (all run at once, so also about the doctor's whole run)."""

Check = tuple[str, Callable[[], Sequence[Finding]]]
"""A check's name (reported when it hangs or fails) and what runs it: one or more
findings."""


def run_checks(checks: Sequence[Check], timeout: float = CHECK_TIMEOUT) -> list[Finding]:
    """Every check at once, each in a daemon thread; their findings in the checks' order.
    A check that raises is a problem naming the error; one not done by the deadline is
    cut (`timed_out`)."""
    results: list[Sequence[Finding] | None] = [None] * len(checks)

    def run(index: int, name: str, check: Callable[[], Sequence[Finding]]) -> None:
        try:
            results[index] = list(check())
        except InputError as exc:
            results[index] = [problem(name, exc.problem, exc.fix or "")]
        except Exception as exc:
            from herder.store import as_unavailable

            unavailable = as_unavailable(exc)
            if unavailable is not None:
                results[index] = [problem(name, redact_urls_in(str(unavailable)),
                                          "check that the database runs and that HERDER_DB "
                                          "(or --db, or [herder] db) names it")]
            else:
                results[index] = [problem(name, redact_urls_in(f"{type(exc).__name__}: {exc}"),
                                          "see the error; rerun with the fault fixed")]

    threads = []
    for index, (name, check) in enumerate(checks):
        thread = threading.Thread(target=run, args=(index, name, check),
                                  name=f"herder-doctor-{name}", daemon=True)
        thread.start()
        threads.append(thread)
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0.0))
    findings: list[Finding] = []
    for (name, _), thread, result in zip(checks, threads, results, strict=True):
        if thread.is_alive() or result is None:
            findings.append(timed_out(name, timeout))
        else:
            findings.extend(result)
    return findings


# --- local: what any machine running herder needs -------------------------------------


def config_finding(config: Config) -> Finding:
    if config.path is None:
        return ok("config", "no herder.toml here: the defaults hold")
    return ok("config", f"{config.path} loads")


def latest_schema(dialect: str) -> int:
    from herder.store.base import load_migrations

    return max((version for version, _, _ in load_migrations(dialect)), default=0)


def schema_of(url: str) -> tuple[int, int, str] | None:
    """The store's schema version, this herder's, and the dialect; None for a SQLite file
    that does not exist yet (opening would create it). The store is never migrated."""
    from herder.store import open_store
    from herder.store.sqlite import parse_sqlite_url

    if url.startswith("sqlite:"):
        path, _ = parse_sqlite_url(url)
        if path != ":memory:" and not os.path.exists(path):
            return None
    store = open_store(url, migrate=False)
    try:
        return store.schema_version(), latest_schema(store.dialect), store.dialect
    finally:
        store.close()


def store_current(url: str) -> bool:
    """Whether the store exists and is at this herder's schema (checks that read it)."""
    found = schema_of(url)
    return found is not None and found[0] == found[1]


def check_store(url: str) -> list[Finding]:
    """The store opens (without migrating it) and is at this herder's schema."""
    shown = redact_url(url)
    found = schema_of(url)
    if found is None:
        return [warning("store", f"{shown} does not exist yet",
                        "run `herder migrate` to create it (the first `herder up` or "
                        "`herder server` also does), or set HERDER_DB / --db")]
    version, latest, dialect = found
    if version < latest:
        return [problem("store", f"{shown} is at schema {version}, this herder's is {latest}",
                        "run `herder migrate` (herder up and herder server also migrate "
                        "at start)")]
    if version > latest:
        return [problem("store", f"{shown} is at schema {version}, newer than this "
                        f"herder's {latest}", "upgrade herder on this machine")]
    return [ok("store", f"{shown} opens at schema {version} ({dialect})")]


def check_programs(config: Config, environ: Mapping[str, str]) -> list[Finding]:
    """Each job type's program (its preflight's first word) is on PATH."""
    from herder.runtime.preflight import job_type_checks

    findings = []
    for name, check in sorted(job_type_checks(config.settings.job_types).items()):
        program = check.argv[0]
        found = find_program(program, environ.get("PATH", os.defpath))
        label = f"program {name}"
        if found is None:
            findings.append(problem(label, f"{program!r} is not found on PATH",
                                    f"install {program}, or fix job_types.{name}.command "
                                    "(a full path, or PATH for herder)"))
        else:
            findings.append(ok(label, f"{program} is {found}"))
    return findings


def check_memory(config: Config) -> list[Finding]:
    """How attempts' memory would be enforced here: a cgroup, or the watchdog."""
    from herder.runtime.cgroup import detect

    runtime = config.settings.runtime
    if runtime.memory_enforcement == "off":
        return [warning("memory", "runtime.memory_enforcement is off: memory is measured, "
                        "never enforced", "set runtime.memory_enforcement = \"auto\"")]
    parent = detect(runtime.cgroup_root)
    if parent is not None:
        return [ok("memory", f"{parent.enforcement} under {parent.path}")]
    fix = ("run the agent under systemd with Delegate=yes (`herder agent install-systemd` "
           "writes such a unit), or set runtime.cgroup_root to a writable memory cgroup "
           "(docs/outcomes.md, Memory)")
    detail = "no writable memory cgroup: the watchdog enforces memory (sampled RSS)"
    if runtime.memory_enforcement == "cgroup":
        return [problem("memory", f"runtime.memory_enforcement is cgroup but {detail}", fix)]
    return [warning("memory", detail, fix)]


def check_escalation(config: Config) -> list[Finding]:
    """Where each weight escalates to: only to a bigger budget, so a chain written out of
    budget order (the default's playwright after heavy) passes over some steps."""
    from herder.core.scheduling.capacity import WeightTable

    climb = WeightTable.from_settings(config.settings).climb()
    return [ok("escalation", f"[fleet] escalation: {'; '.join(climb)}")]


def workspace_job_types(config: Config) -> tuple[str, ...]:
    return tuple(sorted(name for name, job_type in config.settings.job_types.items()
                        if job_type.workspace is not None))


def check_git(with_workspace: Sequence[str], environ: Mapping[str, str]) -> list[Finding]:
    """`git` where a job type (of `with_workspace`) checks out a workspace."""
    if not with_workspace:
        return []
    found = find_program("git", environ.get("PATH", os.defpath))
    if found is None:
        return [problem("git", f"not found on PATH; job type(s) {', '.join(with_workspace)} "
                        "check out a workspace", "install git")]
    return [ok("git", f"{found} (for the workspaces of {', '.join(with_workspace)})")]


def check_alerts(config: Config, environ: Mapping[str, str]) -> list[Finding]:
    from herder.runtime.delivery import check_urls

    urls = check_urls(config.settings.alerts, dict(environ))
    if not urls:
        return [ok("alerts", "no alert URLs configured")]
    return [ok("alerts", f"{len(urls)} alert URL(s) parse")]


def local_checks(config: Config, db: str | None,
                 environ: Mapping[str, str] | None = None) -> list[Check]:
    """`herder doctor`: the store, each job type's program, memory enforcement, where each
    weight escalates to, git for workspaces, the alert URLs (herder.toml itself loaded
    before: `config`)."""
    environ = os.environ if environ is None else environ
    url = config.db_url(db)
    return [
        ("store", lambda: check_store(url)),
        ("programs", lambda: check_programs(config, environ)),
        ("memory", lambda: check_memory(config)),
        ("escalation", lambda: check_escalation(config)),
        ("git", lambda: check_git(workspace_job_types(config), environ)),
        ("alerts", lambda: check_alerts(config, environ)),
    ]


# --- server: what `herder server` needs -----------------------------------------------


def check_database(url: str) -> list[Finding]:
    """The store (PostgreSQL, for a fleet) and who holds the leader lease."""
    findings = check_store(url)
    if any(finding.verdict != "ok" for finding in findings):
        return findings
    if url.startswith("sqlite:"):
        findings.append(warning("database", "SQLite: one machine's processes only",
                                "use PostgreSQL for a server (HERDER_DB=postgresql://...)"))
    from herder.store import open_store

    store = open_store(url, migrate=False)
    try:
        findings.append(lease_finding(store))
    finally:
        store.close()
    return findings


def lease_finding(store: Store) -> Finding:
    lease = store.leader_lease()
    if lease.try_acquire():
        lease.release()
        return warning("leader", "no process holds the leader lease: no server schedules "
                       "this store", "start `herder server` (or `herder up`)")
    return ok("leader", "the leader lease is held by a running server")


def check_listen(config: Config) -> list[Finding]:
    """[server] listen and TLS: a certificate and key both or neither, the key private,
    and no plain http off loopback unless allowed."""
    from herder.runtime.hardening import check_secret_file

    section = config.settings.server
    bind, _, port = section.listen.rpartition(":")
    if not bind or not port.isdigit() or not 0 < int(port) < 65536:
        return [problem("listen", f"server.listen {section.listen!r} is not HOST:PORT",
                        "e.g. listen = \"127.0.0.1:8470\"")]
    if bool(section.tls_cert) != bool(section.tls_key):
        return [problem("tls", "server.tls_cert and server.tls_key: one without the other",
                        "set both, or neither behind a TLS proxy")]
    findings = [ok("listen", section.listen)]
    if section.tls_cert and section.tls_key:
        for key, value in (("tls_cert", section.tls_cert), ("tls_key", section.tls_key)):
            path = config.resolve_path(value)
            if not os.access(path, os.R_OK):
                findings.append(problem("tls", f"server.{key} {path} cannot be read",
                                        "fix the path or its permissions"))
                return findings
        check_secret_file(config.resolve_path(section.tls_key), "server.tls_key")
        findings.append(ok("tls", f"certificate {config.resolve_path(section.tls_cert)}"))
    elif loopback_name(bind):
        findings.append(ok("tls", "none: the server listens on loopback only"))
    elif section.allow_plaintext:
        findings.append(warning("tls", f"none: plain http on {bind} (allow_plaintext)",
                                "set server.tls_cert and server.tls_key"))
    else:
        findings.append(problem("tls", f"{bind} is reachable from the network and the "
                                "server has no TLS", "set server.tls_cert and "
                                "server.tls_key, or listen on 127.0.0.1 behind a TLS proxy"))
    return findings


def check_admin(url: str, config: Config, environ: Mapping[str, str]) -> list[Finding]:
    """An admin token exists (or the deprecated admin variable is set)."""
    from herder.core.access import active_admins
    from herder.store import open_store

    if environ.get(config.settings.server.api_token_env):
        return [warning("admin token", f"{config.settings.server.api_token_env} is set "
                        "(deprecated)", "create one with `herder token create --scope "
                        "admin` and unset the variable")]
    if not store_current(url):
        return []  # the database check says why
    store = open_store(url, migrate=False)
    try:
        admins = active_admins(store.token_list())
    finally:
        store.close()
    if not admins:
        return [problem("admin token", "no admin token exists: operators cannot sign in",
                        "herder token create --scope admin --name ops")]
    return [ok("admin token", f"{len(admins)} active")]


def check_hooks(config: Config, environ: Mapping[str, str]) -> list[Finding]:
    from herder.runtime.hardening import hook_secrets

    sources = hook_secrets(config, environ)
    if not sources:
        return [ok("webhooks", "no webhook sources configured")]
    return [ok("webhooks", f"the secrets of {', '.join(sorted(sources))} read")]


def check_run_as(config: Config, euid: int | None = None) -> list[Finding]:
    from herder.runtime.job_user import resolve

    name = config.settings.runtime.run_as
    if name is None:
        return []
    user = resolve(name, os.geteuid() if euid is None else euid)
    where = f"uid {user.uid}" if user is not None else "herder's own user"
    return [ok("run_as", f"{name} ({where})")]


def server_checks(config: Config, db: str | None,
                  environ: Mapping[str, str] | None = None) -> list[Check]:
    """`herder doctor --server`: the database and the leader lease, listen address and
    TLS, an admin token, the webhook secrets, the run_as user; then the local checks
    (a server runs the local hosts' jobs and sends the alerts)."""
    environ = os.environ if environ is None else environ
    url = config.db_url(db)
    local = [check for check in local_checks(config, db, environ) if check[0] != "store"]
    return [
        ("database", lambda: check_database(url)),
        ("listen", lambda: check_listen(config)),
        ("admin token", lambda: check_admin(url, config, environ)),
        ("webhooks", lambda: check_hooks(config, environ)),
        ("run_as", lambda: check_run_as(config)),
        *local,
    ]


# --- agent: what `herder agent` needs to work for a server ----------------------------

CLOCK_TOLERANCE = 5.0
"""Seconds this host's clock may differ from the server's (its Date header has whole
seconds): leases and heartbeats are timed on both sides."""


class AgentSetup:
    """What `herder doctor --agent` checks against: the server, this host's label, its
    token (from HERDER_AGENT_TOKEN, else the file) and the CA."""

    def __init__(self, server: str, label: str, token_file: str, ca: str | None,
                 allow_plaintext: bool, environ: Mapping[str, str],
                 clock_tolerance: float = CLOCK_TOLERANCE) -> None:
        self.server = server
        self.label = label
        self.token_file = os.path.expanduser(token_file)
        self.ca = ca
        self.allow_plaintext = allow_plaintext
        self.environ = environ
        self.clock_tolerance = clock_tolerance
        """Seconds the clocks may differ (--clock-tolerance)."""

    def token(self) -> tuple[str, Finding]:
        """The token and what was found of where it came from (never the token itself)."""
        from herder.runtime.agent_client import read_token_file

        variable = self.environ.get("HERDER_AGENT_TOKEN", "").strip()
        if variable:
            return variable, ok("token", "from HERDER_AGENT_TOKEN")
        token = read_token_file(self.token_file)
        return token, ok("token", f"{self.token_file} (mode 0600)")

    def client(self, token: str, timeout: float) -> ServerClient:
        from herder.runtime.agent_client import ServerClient

        return ServerClient(self.server, token, self.label,
                            verify=self.ca if self.ca is not None else True,
                            timeout=timeout, allow_plaintext=self.allow_plaintext)


def clock_finding(server_date: str | None, before: float, after: float,
                  tolerance: float = CLOCK_TOLERANCE) -> Finding:
    """The offset of the server's Date header from this host's clock at the request's
    middle; more than `tolerance` seconds is a problem."""
    from email.utils import parsedate_to_datetime

    if not server_date:
        return warning("clock", "the server sent no Date header: the offset is unknown",
                       "check that nothing between this host and the server drops it")
    offset = parsedate_to_datetime(server_date).timestamp() - (before + after) / 2
    # The header has whole seconds: an offset within one is none.
    shown = 0.0 if abs(offset) < 1 else offset
    if abs(offset) > tolerance:
        return problem("clock", f"{shown:+.0f}s from the server's clock (more than "
                       f"{tolerance:g}s)", "synchronise the clocks: timedatectl "
                       "set-ntp true (on this host and the server)")
    return ok("clock", f"{shown:+.0f}s from the server's clock")


def check_server(setup: AgentSetup, timeout: float) -> list[Finding]:
    """The server answers (over TLS, the certificate verifying against the CA), this host's
    token is accepted for its label, and the clocks agree."""
    import httpx

    from herder.runtime.agent_client import Verdict, setup_problem

    try:
        token, token_finding = setup.token()
    except InputError as exc:
        return [problem("token", exc.problem, exc.fix or "")]
    client = setup.client(token, timeout)
    try:
        before = time.time()
        try:
            response = client.http.get("/healthz")
        except httpx.RequestError as exc:
            known = setup_problem(exc, client.server, setup.ca)
            if known is not None:
                return [token_finding, problem("server", known.problem, known.fix or "")]
            return [token_finding, problem(
                "server", f"cannot reach {client.server}: {type(exc).__name__}: {exc}",
                "check the URL, that `herder server` runs there, and the firewall")]
        after = time.time()
        tls = ("TLS, " + (f"the certificate verifies against {setup.ca}" if setup.ca
                          else "the certificate verifies") if client.server.startswith(
                              "https://") else "plain http")
        findings = [ok("server", f"{client.server} answers HTTP {response.status_code} "
                       f"({tls})"), clock_finding(response.headers.get("date"), before, after,
                                                  setup.clock_tolerance)]
        reply = client.request("GET", client.agent_path("/cancels"))
        if reply.verdict is Verdict.OK:
            findings.insert(0, ok("token", f"{token_finding.detail}, accepted for host "
                                  f"{setup.label}"))
        elif reply.verdict is Verdict.UNAUTHORIZED:
            findings.insert(0, problem("token", f"{token_finding.detail}: the server refuses "
                                       f"it for host {setup.label} ({reply.problem})",
                                       "write this host's token (from `herder host add "
                                       f"{setup.label}`) there, or pass the right --host"))
        else:
            findings.insert(0, problem("token", f"{token_finding.detail}: the server answers "
                                       f"{reply.problem}", "check the server's log"))
        return findings
    finally:
        client.close()


class HostPlan(msgspec.Struct, frozen=True):
    """What the doctor runs on an agent host: each allowed job type's preflight, the job
    types that check out a workspace, and the accounts' probes. The server's
    (`GET /api/v1/agent/LABEL/checks`), or this host's herder.toml from a server too old
    to say."""

    preflights: dict[str, PreflightCommand]
    workspaces: tuple[str, ...]
    probes: dict[str, ProbeCommand]
    from_server: bool = True
    """The server chose these commands (run only as the agent's user: `withheld`); False
    for this host's own herder.toml, the operator's file."""


CHECKS_NAME = "job types"
"""The finding that says where the job types and probes came from."""


def local_plan(config: Config, label: str) -> HostPlan:
    """The plan herder.toml here gives (a fallback: the server's store may add accounts,
    and its herder.toml may differ)."""
    from herder.runtime.accounts import ProbeCommand
    from herder.runtime.preflight import job_type_checks

    settings = config.settings
    host = settings.hosts.get(label)
    return HostPlan(
        preflights=job_type_checks(settings.job_types),
        workspaces=workspace_job_types(config),
        probes={} if host is None else {
            name: ProbeCommand(tuple(section.probe), section.probe_timeout,
                               section.probe_interval)
            for name, section in host.accounts.items() if section.probe is not None},
        from_server=False)


def server_plan(body: object) -> HostPlan:
    """The plan of the server's answer (herder.wire.agents.HostChecks)."""
    from herder.runtime.accounts import ProbeCommand
    from herder.runtime.preflight import Check
    from herder.wire.agents import HostChecks

    checks = HostChecks.model_validate(body)
    return HostPlan(
        preflights={name: Check(tuple(job_type.preflight.argv), job_type.preflight.strict,
                                job_type.preflight.timeout, job_type.preflight.cache)
                    for name, job_type in checks.job_types.items()
                    if job_type.preflight is not None},
        workspaces=tuple(sorted(name for name, job_type in checks.job_types.items()
                                if job_type.workspace)),
        probes={name: ProbeCommand(tuple(probe.argv), probe.timeout, probe.interval)
                for name, probe in checks.probes.items()})


def fetch_plan(client: ServerClient, config: Config) -> tuple[HostPlan | None, Finding]:
    """The server's plan for this host, and a finding saying where it came from. A server
    without the route (404: older than this herder) gives herder.toml's here, with a
    warning; any other failure gives none (nothing is run on a guess) and a problem."""
    from pydantic import ValidationError

    from herder.runtime.agent_client import Verdict

    path = client.agent_path("/checks")
    reply = client.request("GET", path)
    if reply.verdict is Verdict.OK:
        try:
            plan = server_plan(reply.body)
        except ValidationError as exc:
            return None, problem(CHECKS_NAME, f"the server's answer to {path} does not parse "
                                 f"({exc.error_count()} error(s))",
                                 "run the same herder version here and on the server")
        return plan, ok(CHECKS_NAME, f"from the server: {len(plan.preflights)} preflight(s), "
                        f"{len(plan.probes)} account probe(s) for host {client.label}")
    if reply.status == 404:
        return local_plan(config, client.label), warning(
            CHECKS_NAME, f"the server has no {path} (older than this herder): the job types "
            "and account probes are read from this host's herder.toml, which may differ "
            "from the server's", "upgrade herder on the server")
    why = "its job types and account probes are unknown, so no preflight or probe ran"
    if reply.verdict is Verdict.UNAUTHORIZED:
        return None, problem(CHECKS_NAME, f"the server refuses this host's token "
                             f"({reply.problem}): {why}", "fix the token (see the token line)")
    if reply.status is None:
        return None, problem(CHECKS_NAME, f"cannot ask {client.server} ({reply.problem}): "
                             f"{why}", "see the server line")
    return None, problem(CHECKS_NAME, f"the server answers {reply.problem}: {why}",
                         "check the server's log")


class PlanSource:
    """The plan, fetched once by the first check that needs it (the checks run at once;
    the others wait for that fetch)."""

    def __init__(self, setup: AgentSetup, config: Config, timeout: float) -> None:
        self.setup = setup
        self.config = config
        self.timeout = timeout
        self._lock = threading.Lock()
        self._found: tuple[HostPlan | None, Finding] | None = None

    def get(self) -> tuple[HostPlan | None, Finding]:
        with self._lock:
            if self._found is None:
                self._found = self._fetch()
            return self._found

    def plan(self) -> HostPlan | None:
        return self.get()[0]

    def workspaces(self) -> tuple[str, ...]:
        plan = self.plan()
        return () if plan is None else plan.workspaces

    def _fetch(self) -> tuple[HostPlan | None, Finding]:
        try:
            token, _ = self.setup.token()
        except InputError as exc:
            return None, problem(CHECKS_NAME, f"no token to ask the server with ({exc.problem}):"
                                 " no preflight or probe ran", "see the token line")
        client = self.setup.client(token, self.timeout)
        try:
            return fetch_plan(client, self.config)
        finally:
            client.close()


class Withheld(msgspec.Struct, frozen=True):
    """Why the server's commands are not run by this doctor, and how to run them."""

    reason: str
    fix: str


def unit_user(text: str) -> str | None:
    """The `User=` of a unit's text (the last one counts, as for systemd); None without
    one."""
    found = None
    for raw in text.splitlines():
        key, separator, value = raw.strip().partition("=")
        if separator and key.strip() == "User":
            found = value.strip() or None
    return found


def uid_of(name: str) -> int | None:
    """The uid a `User=` names (a name or a number); None for a user unknown here."""
    import pwd

    if name.isdigit():
        return int(name)
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


def withheld(unit: str, euid: int, server: str, label: str) -> Withheld | None:
    """None when this doctor runs as the agent's own user, who runs what the server chooses
    anyway (its jobs); otherwise why the server's preflights and probes are not run. A
    server, or one spoofing it, would otherwise get root through `sudo herder doctor
    --agent`, or another user's account: root is the agent's user only when the unit says
    `User=root`; without a unit at `unit` any other user is taken for the agent's."""
    def fix(user: str) -> str:
        return (f"run as the agent's user (e.g. sudo -u {user} herder doctor --agent "
                f"--server {server} --host {label} ...)")

    try:
        text = Path(unit).read_text()
    except FileNotFoundError:
        if euid != 0:
            return None
        return Withheld(f"this doctor runs as root and no agent unit at {unit} names the "
                        "agent's user", fix("USER") + ", or pass --unit with the agent's unit")
    except OSError as exc:
        return Withheld(f"{unit} cannot be read ({exc.strerror}): the agent's user is unknown",
                        fix("USER"))
    name = unit_user(text)
    if name is None:
        return Withheld(f"{unit} names no User= (the agent runs as root, taken for the "
                        "agent's user only when the unit says User=root)",
                        "set User= in the unit (herder agent install-systemd --user NAME), "
                        "then " + fix("NAME"))
    if uid_of(name) == euid:
        return None
    return Withheld(f"this doctor runs as {user_name(euid)}, the agent as {name} (User= of "
                    f"{unit})", fix(name))


def user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def withheld_finding(name: str, count: int, what: str, plan: HostPlan | None,
                     refusal: Withheld | None) -> list[Finding]:
    """The one warning for a group of the server's commands not run (none when they may
    run, come from this host's herder.toml, or there are none)."""
    if plan is None or not plan.from_server or refusal is None or not count:
        return []
    return [warning(name, f"skipped ({count} {what} from the server): {refusal.reason}",
                    refusal.fix)]


def check_preflights(plan: HostPlan | None, pass_env: Sequence[str],
                     refusal: Withheld | None = None) -> list[Finding]:
    """Each allowed job type's preflight, run as the agent runs it (its own timeout each);
    the server's, only as the agent's user (`refusal` says why not)."""
    from herder.runtime import preflight

    skipped = withheld_finding("preflights", len(plan.preflights) if plan else 0,
                               "preflight(s)", plan, refusal)
    if skipped:
        return skipped
    findings = []
    for name, check in sorted((plan.preflights if plan is not None else {}).items()):
        result = preflight.run(check, pass_env)
        label = f"preflight {name}"
        if result.ok:
            findings.append(ok(label, f"{' '.join(check.argv)} answers"))
        else:
            findings.append(problem(label, result.detail,
                                    f"install or fix it, or fix job_types.{name}.preflight"))
    return findings


def check_probes(plan: HostPlan | None, label: str, pass_env: Sequence[str],
                 refusal: Withheld | None = None) -> list[Finding]:
    """The probes of this host's accounts, each run as the agent runs it (its own timeout):
    a dead token is a problem, no usable answer a warning (the runtime takes it as
    healthy). The server's, only as the agent's user (`refusal` says why not)."""
    from herder.runtime.accounts import run_probe

    skipped = withheld_finding("accounts", len(plan.probes) if plan else 0, "probe(s)", plan,
                               refusal)
    if skipped:
        return skipped
    findings = []
    for name, command in sorted((plan.probes if plan is not None else {}).items()):
        result = run_probe(command, pass_env)
        where = f"account {name}"
        fix = (f"check the probe of account {name} (`herder account add {label} {name} "
               "--probe ...`, or hosts.LABEL.accounts.NAME.probe; docs/outcomes.md, Accounts)")
        if result is None:
            findings.append(warning(where, f"its probe {command.argv[0]} gave no usable "
                                    f"answer within {command.timeout:g}s (taken as "
                                    "healthy)", fix))
        elif result.dead:
            findings.append(problem(where, "its probe finds the token dead (no credentials, "
                                    "or expired without a refresh token)",
                                    "sign this account in again on this host"))
        else:
            findings.append(ok(where, "its probe finds the credentials alive"))
    return findings


AGENT_UNIT = "/etc/systemd/system/herder-agent.service"
"""Where `herder agent install-systemd`'s unit is installed (docs/operating.md)."""


def unit_argv(text: str) -> list[str] | None:
    """The ExecStart argv of a unit's text (as systemd reads it: `%%` and `$$` single)."""
    import shlex

    for raw in text.splitlines():
        key, _, value = raw.strip().partition("=")
        if key == "ExecStart":
            return shlex.split(value.replace("%%", "%").replace("$$", "$"))
    return None


def option_values(argv: Sequence[str]) -> dict[str, str]:
    """`--name value` pairs of an argv (flags without a value left out)."""
    return {name: value for name, value in itertools.pairwise(argv)
            if name.startswith("--") and not value.startswith("--")}


def check_unit(setup: AgentSetup, path: str) -> list[Finding]:
    """The installed agent unit (if any) starts an agent for this server, host, token file
    and CA, with a program that exists."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return [ok("systemd unit", f"none at {path} (not installed)")]
    argv = unit_argv(text)
    if not argv or "agent" not in argv:
        return [problem("systemd unit", f"{path} has no ExecStart running `herder agent`",
                        f"rewrite it: herder agent install-systemd ... > {path}")]
    found = option_values(argv[argv.index("agent") + 1:])
    expected = {"--server": setup.server, "--host": setup.label,
                "--token-file": os.path.abspath(setup.token_file)}
    if setup.ca is not None:
        expected["--ca"] = os.path.abspath(setup.ca)
    differ = [f"{name} {found.get(name, '(none)')} where this check has {value}"
              for name, value in expected.items()
              if found.get(name, "").rstrip("/") != value.rstrip("/")]
    fix = (f"rewrite it with `herder agent install-systemd` and these values > {path}, then "
           "systemctl daemon-reload && systemctl restart herder-agent")
    if differ:
        return [problem("systemd unit", f"{path} runs the agent with {'; '.join(differ)}",
                        fix)]
    program = argv[0]
    if not (os.path.isfile(program) and os.access(program, os.X_OK)):
        return [problem("systemd unit", f"{path} starts {program}, which is not an "
                        "executable file", fix)]
    return [ok("systemd unit", f"{path} matches")]


def agent_checks(config: Config, setup: AgentSetup, timeout: float,
                 unit: str = AGENT_UNIT, euid: int | None = None) -> list[Check]:
    """`herder doctor --agent --server URL`: the server over TLS, the token file and its
    acceptance for this host, the clock, the preflight of each job type the server allows
    here and the probe of each of this host's accounts (`GET /api/v1/agent/LABEL/checks`;
    run only as the agent's user, the `User=` of `unit`: `withheld`), memory enforcement,
    git for workspaces, and the installed systemd unit (`unit`) if there is one."""
    source = PlanSource(setup, config, timeout)
    pass_env = config.settings.runtime.pass_env
    uid = os.geteuid() if euid is None else euid

    def refusal() -> Withheld | None:
        return withheld(unit, uid, setup.server, setup.label)

    return [
        ("server", lambda: check_server(setup, timeout)),
        (CHECKS_NAME, lambda: [source.get()[1]]),
        ("preflights", lambda: check_preflights(source.plan(), pass_env, refusal())),
        ("accounts", lambda: check_probes(source.plan(), setup.label, pass_env, refusal())),
        ("memory", lambda: check_memory(config)),
        ("escalation", lambda: check_escalation(config)),
        ("git", lambda: check_git(source.workspaces(), setup.environ)),
        ("systemd unit", lambda: check_unit(setup, unit)),
    ]
