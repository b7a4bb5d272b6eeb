"""`herder server`'s local hosts, each served by a child `herder agent`.

A job on a local host must not be a child of the process that holds the database URL, the
legacy admin token and the webhook secrets. So the server starts, for each local host it
serves, one `python -m herder.cli agent` over a plain-HTTP loopback URL of its own API,
with an environment stripped of herder's variables (`child_environment`: no HERDER_DB) and
a host token minted for it alone. The token reaches it through an inherited pipe
(`--token-file /dev/fd/N`): never in its argv or environment, never on disk. The child is
an agent like any other (its guardian, its heartbeats, its probes and preflights, the
agent rules of rescue); the supervisor here restarts it with backoff when it dies or stops
heartbeating, revokes its token when it is replaced or stopped, and reports its health as
the loop `heartbeat:LABEL`.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec

from herder.core.access import new_token, token_hash
from herder.core.backoff import Backoff
from herder.core.model import HostRecord, Scope, WorkerId
from herder.runtime.hardening import child_environment
from herder.runtime.loop_health import Loop, LoopRegistry
from herder.runtime.maintenance import local_worker_alive
from herder.store import Store

log = logging.getLogger("herder.local")

TOKEN_PREFIX = "local child "
"""The name of a local child's token starts so: `local child LABEL SERVER-WORKER`."""
MAX_CONCURRENCY = 1024
"""The child's upper bound: the host's window cap, which the server sends, is the limit."""
SELF = "/proc/self/exe" if os.path.exists("/proc/self/exe") else None
"""The interpreter this server runs, started again whatever its path: herder's user may
not be able to search the folders of the path it was started by (a symlink into /root);
argv[0] stays that path, so the interpreter finds its virtualenv."""
STOP_GRACE = 30.0
"""How long a stopped child may take to hand its attempts back before SIGKILL."""


class ChildLaunch(msgspec.Struct, frozen=True):
    """What one start of a local host's agent is made of."""

    label: str
    url: str
    token_fd: int
    log_dir: str
    config_path: str | None
    parent_pid: int


def agent_argv(python: str, launch: ChildLaunch) -> list[str]:
    """The child's command line: no secret in it (the token comes through the fd)."""
    config = ["--config", launch.config_path] if launch.config_path else []
    return [python, "-m", "herder.cli", *config, "agent", "--server", launch.url,
            "--host", launch.label, "--token-file", f"/dev/fd/{launch.token_fd}",
            "--concurrency", str(MAX_CONCURRENCY), "--no-ram-check", "--drain-timeout", "0s",
            "--log-dir", launch.log_dir, "--parent-pid", str(launch.parent_pid)]


def token_name(label: str, server_worker: str) -> str:
    return f"{TOKEN_PREFIX}{label} {server_worker}"


def leftover_worker(name: str, label: str) -> WorkerId | None:
    """The server worker a local child's token was minted by, if `name` is one of `label`'s."""
    prefix = f"{TOKEN_PREFIX}{label} "
    return WorkerId.parse(name[len(prefix):]) if name.startswith(prefix) else None


def revoke_leftovers(store: Store, label: str, machine: str, now: datetime) -> int:
    """Revoke the tokens of `label`'s children minted by dead servers of this machine (a
    server killed with SIGKILL never revoked its child's); another replica's stay."""
    revoked = 0
    for record in store.token_list():
        worker = leftover_worker(record.name, label)
        if (record.revoked_at is None and worker is not None and worker.host == machine
                and not local_worker_alive(worker)):
            revoked += store.token_revoke(record.id, now)
    return revoked


class LocalChild:
    """One local host's agent process, supervised on a thread of its own."""

    def __init__(self, store: Store, label: str, *, url: Callable[[float], str | None],
                 machine: str, server_worker: str, log_dir: Path, config_path: str | None,
                 loops: LoopRegistry, heartbeat_interval: float, lease_seconds: float,
                 on_minted: Callable[[str], None] = lambda key: None) -> None:
        self.store = store
        self.on_minted = on_minted
        """Told each minted token's hash: the API lets it past a throttled 127.0.0.1 (a
        job on this machine failing tokens must not lock out its own host's agent)."""
        self.label = label
        self.url = url
        """Waits up to the given seconds for the loopback URL of the server's API."""
        self.machine = machine
        self.server_worker = server_worker
        self.log_dir = log_dir
        self.config_path = config_path
        self.loops = loops
        self.interval = min(heartbeat_interval, 30.0)
        self.lease_seconds = lease_seconds
        self.stopped = threading.Event()
        self.ended = threading.Event()
        """Set once the supervisor is done: the child reaped, its token revoked."""
        self.process: subprocess.Popen[bytes] | None = None
        self.token_id: int | None = None
        self._lock = threading.Lock()

    # -- the supervisor's thread ----------------------------------------------------------------

    def run(self, server_stopping: threading.Event) -> None:
        loop = self.loops.register(f"heartbeat:{self.label}", self.interval)
        backoff = Backoff(base=1.0, cap=30.0)
        try:
            while not self.stopped.is_set():
                url = self.url(min(self.interval, 1.0))
                if url is None:
                    continue  # the server does not listen yet
                try:
                    self._launch(url)
                except Exception as exc:  # the store is down, the fork failed
                    loop.failed(exc)
                    log.exception("cannot start the agent of local host %s", self.label)
                    self.stopped.wait(backoff.next())
                    continue
                ended = self._watch(loop, backoff)
                self._end_child()
                if self.stopped.is_set():
                    break
                loop.failed(ChildExited(ended))
                delay = backoff.next()
                log.warning("the agent of local host %s %s; starting another in %.1fs",
                            self.label, ended, delay)
                self.stopped.wait(delay)
        finally:
            self._end_child()
            if not server_stopping.is_set():
                loop.unregister()  # a host no longer served is no part of the health
            self.ended.set()

    def _launch(self, url: str) -> None:
        revoke_leftovers(self.store, self.label, self.machine, _now())
        token = new_token()
        read_end, write_end = os.pipe()
        try:
            os.write(write_end, token.encode() + b"\n")
        finally:
            os.close(write_end)
        try:
            with self._lock:
                if self.stopped.is_set():
                    return
                self.token_id = self.store.token_insert(
                    token_name(self.label, self.server_worker), Scope.AGENT, token_hash(token),
                    _now(), host=self.label)
                self.on_minted(token_hash(token))
                folder = self.log_dir / "agents" / self.label
                launch = ChildLaunch(self.label, url, read_end, str(folder), self.config_path,
                                     os.getpid())
                try:
                    self.process = subprocess.Popen(
                        agent_argv(sys.executable, launch), executable=SELF,
                        env=child_environment(), pass_fds=(read_end,), stdin=subprocess.DEVNULL)
                except OSError:
                    # Nobody holds the token: it must not stay live until the next start.
                    self.store.token_revoke(self.token_id, _now())
                    self.token_id = None
                    raise
                log.info("local host %s is served by its agent, pid %d", self.label,
                         self.process.pid)
        finally:
            os.close(read_end)

    def _watch(self, loop: Loop, backoff: Backoff) -> str:
        """Until the child ends, is stopped, or stops heartbeating: its health as a loop.
        The host's heartbeat must be fresh (within 3 heartbeat intervals); the child is
        replaced once it has not been for a lease, counted from its start, its last fresh
        heartbeat or the store's last failure (an outage is not the child's doing)."""
        process = self.process
        patience = max(self.lease_seconds, 3 * self.interval)
        judged = time.monotonic()  # when the child was last seen well, or not judgeable
        began = judged
        while process is not None and not self.stopped.is_set():
            code = process.poll()
            if code is not None:
                return f"exited with status {code}"
            try:
                host = self.store.host_get(self.label)
            except Exception as exc:
                loop.failed(exc)
                judged = time.monotonic()
            else:
                if heartbeat_fresh(host, _now(), max(3 * self.interval, 1.0)):
                    loop.succeeded()
                    judged = time.monotonic()
                    if judged - began > self.lease_seconds:
                        backoff.reset()  # it ran well for a while: a new death starts over
                elif time.monotonic() - judged > patience:
                    return "sent no heartbeat within the lease (its token revoked, or wedged)"
            self.stopped.wait(min(self.interval, 1.0))
        return "was stopped"

    def _end_child(self) -> None:
        """SIGTERM (it hands its attempts back), SIGKILL after STOP_GRACE; its token revoked."""
        with self._lock:
            process, self.process = self.process, None
            token_id, self.token_id = self.token_id, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                log.warning("the agent of local host %s ignored SIGTERM: killing it",
                            self.label)
                process.kill()
                process.wait()
        if token_id is not None:
            try:
                self.store.token_revoke(token_id, _now())
            except Exception:
                log.exception("cannot revoke the token of local host %s's agent (id %d)",
                              self.label, token_id)

    # -- from other threads ---------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the supervisor to stop the child (it hands back its attempts) and end."""
        self.stopped.set()


def heartbeat_fresh(host: HostRecord | None, now: datetime, seconds: float) -> bool:
    """Whether the host heartbeated within `seconds` of `now`. Pure."""
    return (host is not None and host.last_heartbeat is not None
            and now - host.last_heartbeat < timedelta(seconds=seconds))


class ChildExited(RuntimeError):
    """The loop's last error while a local host's agent is being restarted."""


def _now() -> datetime:
    return datetime.now(UTC)
