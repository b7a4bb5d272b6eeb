"""`herder doctor`: what this machine needs for its role, one line per check."""

from __future__ import annotations

import json

import click

from herder.cli.root import State, edge, fail, pass_state


@click.command()
@click.option("--server", "server", is_flag=False, flag_value="", default=None,
              metavar="[URL]", help="Alone: check this machine as the server (database, "
              "leader lease, listen address and TLS, admin token, webhook secrets, run_as). "
              "With --agent: the server's URL.")
@click.option("--agent", is_flag=True, help="Check this machine as an agent of the server "
              "given with --server URL (or HERDER_SERVER).")
@click.option("--json", "as_json", is_flag=True, help="The findings as JSON, for scripts.")
@click.option("--timeout", type=click.FloatRange(min=0.1, max=600), default=10.0,
              show_default=True, help="Seconds each check has; a check still running then "
              "is a problem.")
@pass_state
def doctor(state: State, server: str | None, agent: bool, as_json: bool,
           timeout: float) -> None:
    """Check what this machine needs, one line per check (ok, warning or problem, with the
    fix). Exit 0 when nothing is a problem, 1 otherwise."""
    from herder.core.diagnosis import Finding, exit_code, line, problem, summary
    from herder.core.diagnosis import as_json as findings_json
    from herder.core.errors import InputError
    from herder.core.settings.loading import load_config
    from herder.services import doctor as checks

    if agent:
        fail("doctor --agent is not built yet (see `herder doctor --help`)")
    findings: list[Finding]
    try:
        config = load_config(state.config_path)
    except InputError as exc:
        findings = [problem("config", f"{exc.field}: {exc.problem}",
                            exc.fix or "fix herder.toml")]
    else:
        with edge():
            run = (checks.server_checks if server is not None else checks.local_checks)(
                config, state.db)
        findings = [checks.config_finding(config), *checks.run_checks(run, timeout)]
    if as_json:
        click.echo(json.dumps(findings_json(findings), indent=2))
    else:
        for finding in findings:
            click.echo(line(finding))
        click.echo(summary(findings))
    raise SystemExit(exit_code(findings))
