"""systemd units for `herder agent install-systemd`, `herder server install-systemd` and
`herder heartbeat install-systemd` (a oneshot service and its timer): one renderer, so the
services start, stop and restart the same way. Pure text; the commands decide where it
goes."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

import msgspec

from herder.core.errors import InputError


class Unit(msgspec.Struct, frozen=True):
    description: str
    user: str
    workdir: str
    command: Sequence[str]
    """ExecStart's argv; each part quoted for systemd (never a secret: units are world-readable)."""
    restart: str | None
    """None for a oneshot service: its timer starts it again."""
    notes: Sequence[str] = ()
    """Comment lines above ExecStart: what the operator writes once, and why."""
    environment_file: str | None = None
    stop_seconds: int | None = None
    """TimeoutStopSec: how long SIGTERM may take (the agent drains running jobs)."""
    kill_mode: str | None = None
    reload: Sequence[str] = ()
    """ExecReload's argv (the agent: SIGHUP, a restart request)."""
    restart_seconds: int = 15
    hardening: Sequence[str] = ()
    """Sandboxing lines (`HARDENING`)."""
    service_type: str = "simple"
    start_seconds: int | None = None
    """TimeoutStartSec: how long a oneshot service may run."""
    wanted_by: str | None = "multi-user.target"
    """[Install]'s WantedBy; None for a service its timer starts (no [Install])."""


HARDENING = (
    "# Sandboxing: no privilege gain through setuid programs (sudo in a job fails), /usr,",
    "# /boot and /etc read-only (ProtectSystem=full, not strict: jobs write to home folders,",
    "# /var, /srv, /opt), a /tmp of its own, files created private to the user.",
    "NoNewPrivileges=yes",
    "ProtectSystem=full",
    "PrivateTmp=yes",
    "UMask=0077",
)
"""What every unit herder writes runs under."""


def exec_line(argv: Sequence[str]) -> str:
    """argv as ExecStart reads it: quoted like a shell word, `%` doubled (a specifier
    otherwise) and `$` doubled (systemd would expand a variable)."""
    return " ".join(shlex.quote(part).replace("%", "%%").replace("$", "$$") for part in argv)


def render(unit: Unit) -> str:
    service = [f"Type={unit.service_type}", f"User={unit.user}",
               f"WorkingDirectory={unit.workdir}"]
    if unit.environment_file is not None:
        service.append(f"EnvironmentFile={unit.environment_file}")
    service += [f"# {line}".rstrip() for line in unit.notes]
    service.append(f"ExecStart={exec_line(unit.command)}")
    if unit.reload:
        service.append(f"ExecReload={' '.join(unit.reload)}")
    if unit.kill_mode is not None:
        service.append(f"KillMode={unit.kill_mode}")
    if unit.start_seconds is not None:
        service.append(f"TimeoutStartSec={unit.start_seconds}")
    if unit.stop_seconds is not None:
        service.append(f"TimeoutStopSec={unit.stop_seconds}")
    if unit.restart is not None:
        service += [f"Restart={unit.restart}", f"RestartSec={unit.restart_seconds}"]
    service += unit.hardening
    install = ["", "[Install]", f"WantedBy={unit.wanted_by}"] if unit.wanted_by else []
    return "\n".join([
        "[Unit]", f"Description={unit.description}", "After=network-online.target",
        "Wants=network-online.target", "", "[Service]", *service, *install, ""])


HEARTBEAT_TIMEOUT_SECONDS = 50
"""A heartbeat that hangs is stopped before the next minute's is due."""


def heartbeat_timer(label: str, service: str) -> str:
    """The timer that starts the heartbeat service every minute (from boot on; a missed
    minute is not made up: one late heartbeat says as much as many)."""
    return "\n".join([
        "[Unit]", f"Description=herder heartbeat every minute for host {label}", "",
        "[Timer]", "OnCalendar=*-*-* *:*:00", "AccuracySec=5s", f"Unit={service}", "",
        "[Install]", "WantedBy=timers.target", ""])


def environment_line(name: str, value: str) -> str:
    """One `NAME="value"` line of an EnvironmentFile (quotes and backslashes escaped)."""
    if "\n" in value or "\r" in value:
        raise InputError(name, "holds a line break", "an environment file holds one line "
                         "per variable")
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'{name}="{escaped}"'


AGENT_RESTART_SECONDS = 5
"""A crashed agent is started again well within the default `[runtime] adopt_grace` (10 s),
so it adopts its predecessor's running jobs before their guardian kills them."""


def agent_unit(herder: Sequence[str], server: str, label: str, user: str, workdir: str,
               token_file: str, drain_seconds: int, ca: str | None = None,
               allow_plaintext: bool = False) -> Unit:
    """`herder agent` for one host: Restart=always (an agent has no reason to stay down)."""
    return Unit(
        description=f"herder agent for host {label}", user=user, workdir=workdir,
        command=[*herder, "agent", "--server", server, "--host", label,
                 "--token-file", token_file, *(["--ca", ca] if ca else []),
                 *(["--allow-plaintext"] if allow_plaintext else [])],
        restart="always", kill_mode="process", stop_seconds=drain_seconds + 30,
        restart_seconds=AGENT_RESTART_SECONDS,
        reload=("/bin/kill", "-HUP", "$MAINPID"),
        hardening=HARDENING, notes=[
            *token_notes(label, user, token_file),
            "SIGTERM drains: no new work, running jobs finish or are handed back after the",
            "deadline (TimeoutStopSec). To restart (an upgrade) without stopping running jobs:",
            "  systemctl reload herder-agent && systemctl restart herder-agent",
            "reload (SIGHUP) asks for a restart, so the SIGTERM that follows leaves the jobs",
            "running under their supervisors for the next agent, which adopts them.",
            "KillMode=process: systemd signals the agent only, never its jobs nor the guardian",
            "that kills them when no next agent adopts them within [runtime] adopt_grace.",
        ])


def heartbeat_unit(herder: Sequence[str], server: str, label: str, user: str, workdir: str,
                   token_file: str, ca: str | None = None,
                   allow_plaintext: bool = False) -> Unit:
    """One `herder heartbeat` for an ssh push host, started each minute by its timer."""
    return Unit(
        description=f"herder heartbeat for host {label}", user=user, workdir=workdir,
        command=[*herder, "heartbeat", "--server", server, "--host", label,
                 "--token-file", token_file, *(["--ca", ca] if ca else []),
                 *(["--allow-plaintext"] if allow_plaintext else [])],
        restart=None, service_type="oneshot", start_seconds=HEARTBEAT_TIMEOUT_SECONDS,
        wanted_by=None, hardening=HARDENING, notes=token_notes(label, user, token_file))


def token_notes(label: str, user: str, token_file: str) -> list[str]:
    """How the operator writes the host token once, where the unit reads it."""
    token_dir = token_file.rpartition("/")[0] or "/"
    return [
        f"The host token is read from {token_file}: owned by {user}, mode 0600 (herder",
        "refuses a file that group or others can read); never on a command line or in the",
        "environment. Write it once, as root, pasting the token `herder host add` (or",
        f"`herder host token {label}`) printed, then Ctrl-D:",
        f"  install -d -m 755 {token_dir} && install -m 600 -o {user} /dev/null "
        f"{token_file}",
        f"  cat > {token_file}",
    ]


def server_unit(herder: Sequence[str], config: str | None, options: Sequence[str], user: str,
                workdir: str, environment_file: str) -> Unit:
    """`herder [--config FILE] server` with its options (--listen, TLS): Restart=on-failure, so a
    server that exits 1 (its database lost for good, a fatal thread) is started again, and
    one stopped on purpose stays stopped."""
    return Unit(
        description="herder server (fleet coordinator and HTTP API)", user=user,
        workdir=workdir, restart="on-failure",
        command=[*herder, *(["--config", config] if config else []), "server", *options],
        environment_file=environment_file, stop_seconds=30, hardening=HARDENING, notes=[
            "HERDER_DB (the database URL, with its password) and the secrets herder.toml",
            f"names by variable are in {environment_file}: owned by root, mode 0600; never",
            "on the command line or in this unit, which anyone on the machine may read.",
        ])
