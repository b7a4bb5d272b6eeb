"""`herder doctor`: what this machine needs for its role, one line per check."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from herder.cli.root import DEFAULT_TOKEN_FILE, State, duration, edge, pass_state

if TYPE_CHECKING:
    from herder.services.doctor import AgentSetup


@click.command()
@click.option("--server", "server", is_flag=False, flag_value="", default=None,
              metavar="[URL]", help="Alone: check this machine as the server (database, "
              "leader lease, listen address and TLS, admin token, webhook secrets, run_as). "
              "With --agent: the server's URL.")
@click.option("--agent", is_flag=True, help="Check this machine as an agent of the server "
              "given with --server URL (or HERDER_SERVER).")
@click.option("--host", "label", help="With --agent: this host's label (as registered).")
@click.option("--token-file", help="With --agent: the host token's file, mode 0600 "
              "[default: HERDER_AGENT_TOKEN, else ~/.config/herder/agent-token]")
@click.option("--ca", type=click.Path(dir_okay=False), help="With --agent: the CA that "
              "signed the server's certificate [default: herder --ca / HERDER_CA]")
@click.option("--unit", type=click.Path(dir_okay=False), help="With --agent: the agent's "
              "systemd unit to compare, if installed; its User= is the agent's user, the "
              "only one that runs the preflights and probes the server chooses (root only "
              "when it says User=root) [default: /etc/systemd/system/herder-agent.service]")
@click.option("--clock-tolerance", default="5s", show_default=True, metavar="DURATION",
              help="With --agent: how far this host's clock may be from the server's "
              "(e.g. 2s, 30s; at least 1s, the server's Date header has whole seconds).")
@click.option("--json", "as_json", is_flag=True, help="The findings as JSON, for scripts.")
@click.option("--timeout", type=click.FloatRange(min=0.1, max=600), default=10.0,
              show_default=True, help="Seconds each check has; a check still running then "
              "is a problem.")
@pass_state
def doctor(state: State, server: str | None, agent: bool, label: str | None,
           token_file: str | None, ca: str | None, unit: str | None, clock_tolerance: str,
           as_json: bool, timeout: float) -> None:
    """Check what this machine needs, one line per check (ok, warning or problem, with the
    fix). Exit 0 when nothing is a problem, 1 otherwise."""
    from herder.core.diagnosis import Finding, exit_code, line, problem, summary
    from herder.core.diagnosis import as_json as findings_json
    from herder.core.errors import InputError
    from herder.core.settings.loading import load_config
    from herder.services import doctor as checks

    with edge():
        if server and not agent:
            raise InputError("--server", "a URL is for --agent; alone, --server checks this "
                             "machine as the server", "pass --server alone, or --agent "
                             "--server URL --host LABEL")
        clock_seconds = tolerance(clock_tolerance)
    findings: list[Finding]
    try:
        config = load_config(state.config_path)
    except InputError as exc:
        findings = [problem("config", f"{exc.field}: {exc.problem}",
                            exc.fix or "fix herder.toml")]
    else:
        with edge():
            if agent:
                setup = agent_setup(state, server, label, token_file, ca, clock_seconds)
                run = checks.agent_checks(config, setup, timeout, unit or checks.AGENT_UNIT)
            elif server is not None:
                run = checks.server_checks(config, state.db)
            else:
                run = checks.local_checks(config, state.db)
        findings = [checks.config_finding(config), *checks.run_checks(run, timeout)]
    if as_json:
        click.echo(json.dumps(findings_json(findings), indent=2))
    else:
        for finding in findings:
            click.echo(line(finding))
        click.echo(summary(findings))
    raise SystemExit(exit_code(findings))


def tolerance(value: str) -> float:
    """--clock-tolerance in seconds; InputError (exit 2) naming it otherwise."""
    from herder.core.errors import InputError

    seconds = duration(value, "--clock-tolerance")
    if seconds is None or seconds < 1:
        raise InputError("--clock-tolerance", f"{value!r} is under a second: the server's "
                         "Date header has whole seconds", "pass at least 1s, e.g. 5s")
    return seconds


def agent_setup(state: State, server: str | None, label: str | None, token_file: str | None,
                ca: str | None, clock_tolerance: float) -> AgentSetup:
    """--agent's server, host, token file and CA; InputError (exit 2) naming what is
    missing."""
    import os

    from herder.core.errors import InputError
    from herder.runtime.agent_client import check_server_url
    from herder.services.doctor import AgentSetup

    url = server or state.server
    if not url:
        raise InputError("--server", "--agent needs the server's URL",
                         "pass --agent --server URL (or set HERDER_SERVER)")
    if not label:
        raise InputError("--host", "--agent needs this host's label",
                         "pass --host LABEL, as the host was added")
    return AgentSetup(check_server_url(url, state.allow_plaintext), label,
                      token_file or state.token_file or DEFAULT_TOKEN_FILE, ca or state.ca,
                      state.allow_plaintext, os.environ, clock_tolerance)
