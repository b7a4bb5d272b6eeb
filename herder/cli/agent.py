"""Commands a host runs against a server: agent (and install-systemd), run-attempt, heartbeat."""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from herder.cli.root import (
    DEFAULT_TOKEN_FILE,
    LOG_FORMAT_OPTION,
    State,
    duration,
    edge,
    fail,
    installed_herder,
    log_to_stderr,
    names,
    pass_state,
    utcnow,
)
from herder.core.errors import InputError

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime

    from herder.core.scheduling.alerting import Trouble
    from herder.runtime.agent_client import ServerClient
    from herder.runtime.agent_trouble import TroubleWatch

PLAINTEXT_OPTION = click.option(
    "--allow-plaintext", is_flag=True, envvar="HERDER_ALLOW_PLAINTEXT",
    help="Accept a plain http --server off loopback (a network you trust) "
    "[env HERDER_ALLOW_PLAINTEXT].")


def token_options(function: Any) -> Any:
    """--token and --token-file, shared by the commands that talk to a server as a host."""
    options = [
        click.option("--token", envvar="HERDER_AGENT_TOKEN",
                     help="The host token; wins over --token-file [env HERDER_AGENT_TOKEN]."),
        click.option("--token-file", envvar="HERDER_TOKEN_FILE", default=DEFAULT_TOKEN_FILE,
                     show_default=True,
                     help="File holding the host token, mode 0600 [env HERDER_TOKEN_FILE]."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def agent_token(token: str | None, token_file: str) -> str:
    """--token / HERDER_AGENT_TOKEN, else the file (refused when others may read it).
    A token given as --token itself is in the command line, which every local process
    (jobs included) can read in /proc/PID/cmdline: deprecated, with a warning."""
    from herder.runtime.agent_client import read_token_file

    if token and token.strip():
        warn_secret_flag("token", "--token", "HERDER_AGENT_TOKEN or --token-file")
        return token.strip()
    return read_token_file(os.path.expanduser(token_file))


def warn_secret_flag(parameter: str, option: str, instead: str) -> None:
    """Say so when a secret came as a command-line option (not from its variable)."""
    from click.core import ParameterSource

    context = click.get_current_context(silent=True)
    if context is not None and context.get_parameter_source(parameter) is \
            ParameterSource.COMMANDLINE:
        click.echo(f"herder: warning: {option} puts a secret in the command line, which "
                   f"every process on this machine can read; it is deprecated: use {instead}",
                   err=True)


def private_logs(state: State, log_dir: str | None) -> Path:
    """The attempt logs' folder (--log-dir, else herder.toml's), made private to this user."""
    from herder.runtime.hardening import private_folder

    folder = Path(log_dir) if log_dir else state.config.log_dir
    private_folder(folder, "--log-dir" if log_dir else "herder.log_dir")
    return folder


def forget_token_variable(state: State) -> None:
    """Jobs and helpers start from this process's environment: no secret may be in it
    (HERDER_AGENT_TOKEN, HERDER_TOKEN, herder.toml's secret variables)."""
    from herder.runtime.hardening import secret_variables, withdraw_secrets

    withdraw_secrets(secret_variables(state.config.settings))


@click.group(invoke_without_command=True)
@click.option("--host", "label", help="The host's label.")
@click.option("--server", help="Report through this server instead of the database.")
@token_options
@click.option("--ca", type=click.Path(exists=True, dir_okay=False),
              help="CA bundle that signed the server's certificate.")
@PLAINTEXT_OPTION
@click.pass_context
def heartbeat(ctx: click.Context, label: str | None, server: str | None, token: str | None,
              token_file: str, ca: str | None, allow_plaintext: bool) -> None:
    """One heartbeat for a host (ssh push hosts: a systemd timer, `herder heartbeat
    install-systemd`, or cron: `* * * * * herder heartbeat ...`)."""
    if ctx.invoked_subcommand is not None:
        return
    state: State = ctx.obj
    if not label:
        with edge():
            raise InputError("--host", "is required", "pass the host label it was added with")
    if server:
        from herder.runtime.agent_client import ServerClient, Verdict, setup_problem

        with edge():
            client = ServerClient(server, agent_token(token, token_file), label,
                                  verify=ca or True,
                                  allow_plaintext=allow_plaintext or state.allow_plaintext)
            reply = client.request("POST", f"/api/v1/hosts/{label}/heartbeat")
            client.close()
            if reply.status is None:
                problem = setup_problem(reply.error, client.server, client.ca)
                if problem is not None:
                    raise problem
                fail(f"cannot reach {client.server}: {reply.problem}")
            if reply.verdict is Verdict.UNAUTHORIZED:
                fail(client.refusal(reply))
            if reply.verdict is not Verdict.OK:
                fail(f"the server answered {reply.problem}")
        click.echo(f"heartbeat sent for {label}")
        return
    with edge():
        if not state.store.host_heartbeat_push(label, utcnow(), "cli"):
            fail(f"no host {label!r} (see `herder hosts`)")
    click.echo(f"heartbeat recorded for {label}")


UNIT_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?$")
"""A user name systemd's `User=` takes (no blanks: a unit line ends at a newline)."""


def check_unit_values(label: str, user: str, **paths: str | None) -> None:
    """What goes into a unit line: a newline in any value would add a line of its own
    (`ExecStartPre=...`), so each is refused naming its option (exit 2)."""
    from herder.core.settings.fields import NAME as _NAME

    if not _NAME.fullmatch(label):
        raise InputError("--host", f"{label!r} is not a valid host label",
                         "pass the label the host was added with")
    if not UNIT_USER.fullmatch(user):
        raise InputError("--user", f"{user!r} is not a user name", "pass a user name")
    for option, value in paths.items():
        if value is not None and any(ord(char) < 32 or ord(char) == 127 for char in value):
            raise InputError(f"--{option.replace('_', '-')}",
                             f"{value!r} holds a control character", "pass it on one line")


_Command = TypeVar("_Command", bound="Callable[..., Any]")


def unit_options(reader: str) -> Callable[[_Command], _Command]:
    """The options both install-systemd commands (agent, heartbeat) start with, in the order
    --help lists them; `reader` is who reads the token file."""
    options = (
        click.option("--server", "server_url", required=True),
        click.option("--host", "label", required=True),
        click.option("--user", default=lambda: os.environ.get("USER", "herder")),
        click.option("--token-file", default="/etc/herder/agent-token", show_default=True,
                     help=f"Where {reader} reads the host token (mode 0600, owned by --user)."),
    )

    def apply(command: _Command) -> _Command:
        for option in reversed(options):
            command = option(command)
        return command

    return apply


CA_OPTION = click.option(
    "--ca", type=click.Path(exists=True, dir_okay=False),
    help="The CA that signed the server's certificate (its absolute path is written).")


HEARTBEAT_UNIT_DIR = "/etc/systemd/system"


@heartbeat.command("install-systemd")
@unit_options("the heartbeat")
@CA_OPTION
@click.option("--unit-dir", default=HEARTBEAT_UNIT_DIR, show_default=True,
              type=click.Path(file_okay=False),
              help="Where herder-heartbeat.service and herder-heartbeat.timer are written.")
@click.option("--print", "print_only", is_flag=True,
              help="Print both units instead; write nothing.")
@PLAINTEXT_OPTION
def install_heartbeat_systemd(server_url: str, label: str, user: str, token_file: str,
                              ca: str | None, unit_dir: str, print_only: bool,
                              allow_plaintext: bool) -> None:
    """Write a oneshot service running `herder heartbeat` and the timer that starts it every
    minute (an ssh push host, which has no agent to heartbeat for it)."""
    from herder.cli.systemd_unit import heartbeat_timer, heartbeat_unit, render
    from herder.runtime.agent_client import check_server_url

    with edge():
        check_unit_values(label, user, server=server_url, token_file=token_file, ca=ca,
                          unit_dir=unit_dir)
        server_url = check_server_url(server_url, allow_plaintext)
        for option, path in (("--token-file", token_file), ("--unit-dir", unit_dir)):
            if not os.path.isabs(path):
                raise InputError(option, f"{path!r} is not an absolute path",
                                 "systemd needs one, e.g. " + (
                                     "/etc/herder/agent-token" if option == "--token-file"
                                     else HEARTBEAT_UNIT_DIR))
        service = "herder-heartbeat.service"
        units = {
            service: render(heartbeat_unit(installed_herder(), server_url, label, user,
                                           os.getcwd(), token_file,
                                           os.path.abspath(ca) if ca else None,
                                           allow_plaintext)),
            "herder-heartbeat.timer": heartbeat_timer(label, service)}
        if print_only:
            for name, text in units.items():
                click.echo(f"# {os.path.join(unit_dir, name)}\n{text}")
            return
        for name, text in units.items():
            path = os.path.join(unit_dir, name)
            try:
                with open(path, "w", encoding="utf-8") as out:
                    out.write(text)
            except OSError as exc:
                raise InputError("--unit-dir", f"cannot write {path}: {exc.strerror or exc}",
                                 "run it as root, or pass --print") from None
    click.echo(f"wrote {', '.join(os.path.join(unit_dir, name) for name in units)}", err=True)
    click.echo("next: write the token file (see the service's comments), then "
               "systemctl daemon-reload && systemctl enable --now herder-heartbeat.timer",
               err=True)



@click.group(invoke_without_command=True)
@click.option("--server", "server_url", envvar="HERDER_SERVER", help="https://server:8470")
@token_options
@click.option("--host", "label", help="This host's label (as registered).")
@click.option("--concurrency", type=click.IntRange(1, 1024), default=64, show_default=True,
              help="Upper bound; the host's window cap from the server applies too.")
@click.option("--job-types", help="Local allow-list of job types (fail-closed).")
@click.option("--weights", help="Local allow-list of weights (fail-closed).")
@click.option("--priority-floor", type=int, help="Refuse jobs more urgent than this.")
@click.option("--no-ram-check", is_flag=True, help="Skip the free RAM check (MemAvailable).")
@click.option("--drain-timeout", default="10m", show_default=True,
              help="On SIGTERM, how long running jobs may finish before being handed back.")
@click.option("--ca", type=click.Path(exists=True, dir_okay=False),
              help="CA bundle that signed the server's certificate.")
@click.option("--log-dir", type=click.Path(file_okay=False), help="Local attempt logs.")
@PLAINTEXT_OPTION
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
@LOG_FORMAT_OPTION
@click.option("--parent-pid", type=int, hidden=True,
              help="A local host's agent under `herder server`: die with this parent.")
@click.pass_context
def agent(ctx: click.Context, server_url: str | None, token: str | None, token_file: str,
          label: str | None, concurrency: int, job_types: str | None, weights: str | None,
          priority_floor: int | None, no_ram_check: bool, drain_timeout: str, ca: str | None,
          log_dir: str | None, allow_plaintext: bool, log_level: str, log_format: str,
          parent_pid: int | None) -> None:
    """Run this host's jobs for a `herder server` (outbound HTTP(S) only).

    SIGTERM drains; after SIGHUP (a restart request) SIGTERM leaves the running jobs to the
    next agent of the host, which adopts them within [runtime] adopt_grace."""
    if ctx.invoked_subcommand is not None:
        return
    if parent_pid is not None:
        die_with_parent(parent_pid)
    from herder.runtime.hardening import harden_process

    harden_process()  # first: the imports below take tens of milliseconds
    from herder.runtime.agent import HttpSource
    from herder.runtime.agent_client import ServerClient, check_server_url
    from herder.runtime.job_user import job_user_at_start, warn_root
    from herder.runtime.local_gate import LocalGate
    from herder.runtime.runner import Runner
    from herder.runtime.runner_options import RunnerOptions

    log_to_stderr(log_level, log_format)
    state: State = ctx.obj
    with edge():
        if not label:
            raise InputError("--host", "is required", "pass the host label it was added with")
        if not server_url:
            raise InputError("--server", "is required", "pass --server https://host:8470")
        plaintext = allow_plaintext or state.allow_plaintext
        check_server_url(server_url, plaintext)
        secret = agent_token(token, token_file)
        forget_token_variable(state)
        logs = private_logs(state, log_dir)
        drain = duration(drain_timeout, "--drain-timeout")
        runtime = state.config.settings.runtime
        job_user_at_start(runtime.run_as, warn=False)
        if runtime.kill_grace >= runtime.attempt_lease:
            logging.getLogger("herder.agent").warning(
                "kill_grace (%.0fs) is not shorter than attempt_lease (%.0fs): after a crash "
                "the server may rerun a job before its old processes are gone",
                runtime.kill_grace, runtime.attempt_lease)
        client = ServerClient(server_url, secret, label, verify=ca or True,
                              allow_plaintext=plaintext)
        trouble = trouble_watch(state, label, logs)
        client.observer = trouble.observe
        # A setup that cannot work (scheme, TLS, certificate) ends here, in one line; a
        # server that is not up yet is waited for.
        client.check()
        warn_root(runtime.run_as)
        # Then, before any thread exists: the guardian that cleans up if this agent dies
        # (and tells the server, so its jobs are rerun at once).
        from herder.core.model import WorkerId
        from herder.runtime.attempt_files import HANDOVER_FOLDER, note_agent
        from herder.runtime.guardian import report_gone, start_guardian
        from herder.runtime.preflight import Preflight
        from herder.runtime.process import process_start_time

        worker_id = WorkerId(label, os.getpid(), process_start_time(os.getpid()) or 0)
        worker = str(worker_id)
        # The guardian of a dead agent waits adopt_grace for the next one to adopt its
        # attempts; they meet through handover files in the log folder.
        handover = logs / HANDOVER_FOLDER
        guardian = start_guardian(runtime.kill_grace, report=lambda: report_gone(
            server_url, secret, label, worker, ca, allow_plaintext=plaintext),
            adopt_grace=runtime.adopt_grace, handover=handover)
        source = HttpSource(
            client, LocalGate(names(job_types), names(weights), priority_floor),
            concurrency, runtime.heartbeat_interval, state.config.settings.server.long_poll,
            check_ram=not no_ram_check, kill_grace=runtime.kill_grace,
            preflight=Preflight(pass_env=runtime.pass_env),
        )
        source.guardian = guardian
        trouble.start(functools.partial(report_trouble, client), threading.Event())
        source.handover = handover
        try:  # so a next agent knows this one's launch notes are in its log folder
            note_agent(handover, worker_id)
        except OSError as exc:  # then a next agent takes none of its work over: safe
            logging.getLogger("herder.agent").warning(
                "cannot note this agent in %s: %s", handover, exc)
        options = RunnerOptions.from_settings(
            state.config.settings, label, logs,
            concurrency=concurrency, drain_timeout=drain)
        runner = Runner(None, options, source=source)
        source.in_flight = lambda: len(runner.running)
        sys.exit(runner.run())


def trouble_watch(state: State, label: str, logs: Path) -> TroubleWatch:
    """The agent's own trouble with its server, raised through its own [alerts] urls (if
    its herder.toml has any) and told to the server once it is back."""
    from herder.runtime.agent_trouble import TroubleWatch
    from herder.runtime.delivery import Delivery, check_urls

    alerts = state.config.settings.alerts
    urls = check_urls(alerts)
    return TroubleWatch(label, alerts.agent_unreachable, logs,
                        Delivery(urls, alerts) if urls else None)


def report_trouble(client: ServerClient, trouble: Trouble, until: datetime,
                   delivered: bool) -> None:
    from herder.runtime.agent_trouble import trouble_body

    client.call("POST", "/trouble", retry=False, json=trouble_body(trouble, until, delivered))


def die_with_parent(parent: int) -> None:
    """A local host's agent ends with the server that started it (SIGKILL, as the server's
    own jobs would have: its guardian then kills its jobs), not orphaned with a stale token."""
    import ctypes
    import signal

    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PDEATHSIG
    if os.getppid() != parent:  # the server died before the line above
        sys.exit(1)


@agent.command("install-systemd")
@unit_options("the unit's agent")
@click.option("--drain-seconds", type=int, default=600, show_default=True)
@CA_OPTION
@PLAINTEXT_OPTION
def install_systemd(server_url: str, label: str, user: str, token_file: str,
                    drain_seconds: int, ca: str | None, allow_plaintext: bool) -> None:
    """Print a systemd unit (Restart=always) for this host's agent."""
    from herder.cli.systemd_unit import agent_unit, render
    from herder.runtime.agent_client import check_server_url

    with edge():
        check_unit_values(label, user, server=server_url, token_file=token_file, ca=ca)
        server_url = check_server_url(server_url, allow_plaintext)
        if not os.path.isabs(token_file):
            raise InputError("--token-file", f"{token_file!r} is not an absolute path",
                             "systemd needs one, e.g. /etc/herder/agent-token")
    click.echo(render(agent_unit(installed_herder(), server_url, label, user, os.getcwd(),
                                 token_file, drain_seconds,
                                 os.path.abspath(ca) if ca else None,
                                 allow_plaintext)), nl=False)


RUN_ATTEMPT_PATIENCE = 30.0
"""How long `run-attempt` waits for an unreachable server before it gives up (exit 2)."""


@click.command("run-attempt")
@click.option("--server", "server_url", required=True)
@click.option("--host", "label", required=True)
@click.option("--job", "job_id", type=int, required=True)
@click.option("--attempt", type=int, required=True)
@token_options
@click.option("--ca", type=click.Path(exists=True, dir_okay=False))
@click.option("--no-ram-check", is_flag=True)
@click.option("--log-dir", type=click.Path(file_okay=False))
@PLAINTEXT_OPTION
@pass_state
def run_attempt(state: State, server_url: str, label: str, job_id: int, attempt: int,
                token: str | None, token_file: str, ca: str | None, no_ram_check: bool,
                log_dir: str | None, allow_plaintext: bool) -> None:
    """Run one placed attempt on this host and report it (what ssh push runs remotely).

    Exit codes: 0 ran and reported; 1 bad arguments (token, URL, certificate) or no such
    attempt; 2 the server cannot be reached; 3 RAM contention.
    """
    from herder.runtime.hardening import harden_process

    harden_process()  # first: the imports below take tens of milliseconds
    from herder.core.model import AttemptToken, Outcome
    from herder.runtime.agent_client import ServerClient, ServerUnavailable
    from herder.runtime.job_user import job_user_at_start
    from herder.runtime.local_gate import LocalGate
    from herder.runtime.runner import Runner
    from herder.runtime.runner_options import RunnerOptions
    from herder.runtime.single_attempt import SingleAttemptSource, fetch_attempt

    log_to_stderr("info")
    runtime = state.config.settings.runtime
    with edge():  # exit 2 before anything is fetched: a spawn failure, tried again later
        job_user_at_start(runtime.run_as)
    try:
        client = ServerClient(server_url, agent_token(token, token_file), label,
                              verify=ca or True, retry_cap=max(runtime.heartbeat_interval, 0.2),
                              allow_plaintext=allow_plaintext or state.allow_plaintext)
        forget_token_variable(state)
        logs = private_logs(state, log_dir)
        client.check(patience=RUN_ATTEMPT_PATIENCE)
    except InputError as exc:
        fail(str(exc), code=1)
    except ServerUnavailable as exc:
        fail(str(exc), code=2)
    job, lease = fetch_attempt(client, AttemptToken(job_id, attempt))
    if job is None:
        fail(f"attempt {job_id}.{attempt} is not placed on {label}", code=1)
    # Before the source's threads: a frozen or killed run-attempt must not leave its job
    # running past the lease (the server would run it elsewhere).
    from herder.runtime.guardian import start_guardian

    guardian = start_guardian(runtime.kill_grace)
    source = SingleAttemptSource(client, LocalGate(), job, check_ram=not no_ram_check,
                                 heartbeat_interval=runtime.heartbeat_interval,
                                 kill_grace=runtime.kill_grace)
    source.guardian = guardian
    source.learn_lease(lease)
    options = RunnerOptions.from_settings(
        state.config.settings, label, logs,
        concurrency=1, poll_interval=0.2, exit_when_idle=True)
    Runner(None, options, source=source).run()
    if source.handed_back is Outcome.RAM_CONTENTION:
        sys.exit(3)




PREFLIGHT_INPUT_BYTES = 1024 * 1024


@click.command("preflight")
@pass_state
def preflight(state: State) -> None:
    """Run the job types' preflights read from stdin, on this host, and print their verdicts
    (what the server runs over ssh on a push host: the checks on stdin, never on argv).

    Input: {"TYPE": {"argv": [...], "strict": bool, "timeout": s}}; output: {"TYPE": {"ok":
    bool, "detail": "..."}}. Exit 2 on input that is not that.
    """
    from herder.runtime.hardening import harden_process

    harden_process()
    import msgspec

    from herder.runtime.preflight import Check, run

    with edge():
        try:
            checks = msgspec.json.decode(sys.stdin.buffer.read(PREFLIGHT_INPUT_BYTES),
                                         type=dict[str, Check])
        except msgspec.DecodeError as exc:  # ValidationError too
            raise InputError("stdin", f"not a set of preflight checks: {exc}",
                             'send {"TYPE": {"argv": ["prog", "--version"]}}') from None
        pass_env = state.config.settings.runtime.pass_env
    verdicts = {}
    for job_type, check in sorted(checks.items()):
        result = run(check, pass_env) if check.argv else None
        verdicts[job_type] = ({"ok": result.ok, "detail": result.detail} if result
                              else {"ok": False, "detail": "no command"})
    click.echo(msgspec.json.encode(verdicts).decode())
