"""Job commands: submit, jobs, show, logs, cancel, retry, should-dispatch."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import click

from herder.cli.root import (
    EXIT_SKIP,
    State,
    columns,
    duration,
    edge,
    elapsed,
    fail,
    labelled,
    pass_state,
)
from herder.core.errors import InputError
from herder.core.model import JobStatus, launch_errors

if TYPE_CHECKING:
    from herder.services.operator import Operator



def _named_values(items: Sequence[str], option: str, form: str,
                  example: str) -> dict[str, str]:
    """`--env` and `-p` pairs as a dict, split at the first `=`: one without a `=` or a name
    is refused, naming the option and its `form` (NAME=VALUE)."""
    values: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InputError(option, f"{item!r} is not {form}", example)
        values[name] = value
    return values


class SubmitCommand(click.Command):
    """Everything after `--` is the ad-hoc command, passed through untouched."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            index = args.index("--")
            ctx.meta["herder.command"] = args[index + 1 :]
            args = args[:index]
        return super().parse_args(ctx, args)


@click.command(cls=SubmitCommand)
@click.argument("job_type", required=False)
@click.option("-p", "--param", "params", multiple=True, metavar="KEY=VALUE",
              help="A payload field (repeatable); JSON values keep their type.")
@click.option("--payload", help="The payload as a JSON object.")
@click.option("--priority", type=int, help="Lower runs first.")
@click.option("--weight", help="RAM class (light, heavy, ...).")
@click.option("--dedup-key", help="At most one active or done job per key.")
@click.option("--force", is_flag=True, help="With --dedup-key: rerun even if a done job has it.")
@click.option("--host", "affinity", help="Run only on this host.")
@click.option("--delay", help="Not before this long from now (e.g. 10m).")
@click.option("--max-attempts", type=int, help="Failed attempts before the job fails.")
@click.option("--timeout", help="Stop an attempt after this long (e.g. 30m).")
@click.option("--workdir", type=click.Path(), help="Directory to run in [default: here].")
@click.option("--env", "env_pairs", multiple=True, metavar="NAME=VALUE",
              help="Extra environment variable (repeatable).")
@click.option("--no-check", is_flag=True, help="Do not check that the command exists here.")
@click.option("--wait", is_flag=True, help="Block until the job ends; exit 0 only if done.")
@click.pass_context
def submit(ctx: click.Context, job_type: str | None, params: Sequence[str],
           payload: str | None, priority: int | None, weight: str | None,
           dedup_key: str | None, force: bool, affinity: str | None, delay: str | None,
           max_attempts: int | None, timeout: str | None, workdir: str | None,
           env_pairs: Sequence[str], no_check: bool, wait: bool) -> None:
    """Submit a job: `herder submit JOB_TYPE -p key=value` or `herder submit -- CMD ARGS...`.

    Prints only the job id. With a dedup key already held, prints the holder's id
    (and says so on stderr).
    """
    from herder.services.intake import parse_assignments, parse_payload

    state: State = ctx.obj
    command: list[str] | None = ctx.meta.get("herder.command")
    with edge():
        body: dict[str, Any] = parse_payload(payload) if payload else {}
        body.update(parse_assignments(params))
        env = _named_values(env_pairs, "--env", "NAME=VALUE", "write --env KEY=value")
        delay_seconds = duration(delay, "--delay")
        try:
            available_at = (datetime.now(UTC) + timedelta(seconds=delay_seconds)
                            if delay_seconds else None)
        except OverflowError as exc:
            raise InputError("--delay", f"{delay!r} is too far in the future") from exc
        if max_attempts is not None and max_attempts < 1:
            raise InputError("--max-attempts", "must be at least 1", "pass 1 or more")
        client = state.client
        result = client.submit(
            job_type, command, body, priority=priority, weight=weight, dedup_key=dedup_key,
            force=force, affinity=affinity, available_at=available_at,
            max_attempts=max_attempts, timeout_seconds=duration(timeout, "--timeout"),
            workdir=workdir, env=env, check_command=not no_check,
        )
        if not result.created:
            click.echo(f"herder: dedup key {dedup_key!r} is held by job {result.job_id} "
                       f"({result.status}); not submitted again", err=True)
        click.echo(result.job_id)
        if wait:
            job = client.wait(result.job_id)
            sys.exit(0 if job.status is JobStatus.DONE else 1)


# -- reading ----------------------------------------------------------------------------------


def _age(value: datetime | None) -> str:
    if value is None:
        return "-"
    return elapsed((datetime.now(UTC) - value).total_seconds())


@click.command()
@click.option("--status", "statuses", multiple=True,
              type=click.Choice([s.value for s in JobStatus]), help="Only these (repeatable).")
@click.option("--limit", type=click.IntRange(1, 100_000), default=50, show_default=True)
@click.option("--actionable", is_flag=True,
              help="Only jobs whose last decision someone should look at (a code fault, a "
                   "timeout, a revoked login), not weather; e.g. with --status failed.")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of job objects.")
@pass_state
def jobs(state: State, statuses: Sequence[str], limit: int, actionable: bool,
         as_json: bool) -> None:
    """List jobs, newest first."""
    with edge():
        found = state.reader.list([JobStatus(s) for s in statuses] or None, limit)
    if actionable:
        found = [job for job in found if job.actionable]
    if as_json:
        from herder.services.views import job_view  # the API's shapes (pydantic): only for --json

        click.echo(json.dumps([job_view(job) for job in found], indent=2))
        return
    header = ("ID", "STATUS", "TYPE", "PRI", "WEIGHT", "ATT", "HOST", "AGE", "COMMAND")
    rows = [(str(job.id), job.status.value, job.job_type, str(job.priority), job.weight,
             f"{job.attempt}/{job.max_attempts}", job.host or "-", _age(job.created_at),
             " ".join(job.command)[:60]) for job in found]
    for line in columns(header, rows):
        click.echo(line)


@click.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="The job, its attempts and events.")
@pass_state
def show(state: State, job_id: int, as_json: bool) -> None:
    """Show one job with its attempts and history."""
    with edge():
        job, attempts, events = state.reader.history(job_id)
    if as_json:
        from herder.wire.jobs import JobDetail  # pydantic: only here

        click.echo(json.dumps(JobDetail.of_history(job, attempts, events).model_dump(mode="json"),
                              indent=2))
        return
    for key in ("id", "status", "job_type", "priority", "weight", "attempt", "max_attempts",
                "failures", "transient_attempts", "spawn_failures", "lost", "host",
                "exit_code", "failure_reason", "dedup_key", "command", "workdir",
                "created_at", "started_at", "finished_at", "available_at"):
        value = getattr(job, key)
        if isinstance(value, datetime):
            value = value.isoformat()  # as --json writes it
        elif isinstance(value, tuple):
            value = list(value)
        if (value is not None and value != 0) or key in ("attempt", "failures"):
            click.echo(labelled(key, value))
    if job.status is JobStatus.FAILED:
        flags = ["needs a human" if job.human_action else "",
                 "actionable" if job.actionable else "not actionable"]
        click.echo(labelled("failure", ", ".join(f for f in flags if f)))
    last = next((dict(e.detail) for e in reversed(events) if e.kind == "finished"), {})
    result = last.get("result") if isinstance(last.get("result"), dict) else None
    for label, value in (("result", (result or {}).get("summary")),
                         ("cost_usd", last.get("cost_usd")),
                         ("result_error", last.get("result_error")),
                         ("launch_error", last.get("launch_error"))):
        if value is not None:
            click.echo(labelled(label, value))
    if attempts:
        click.echo("\n" + click.style("attempts", bold=True))
        under = {e.attempt: f" account={e.detail.get('account')}" for e in events
                 if e.kind == "account"}
        unstarted = launch_errors(events)
        for a in attempts:
            click.echo(f"  #{a.attempt} {a.host} pid={a.pid} {a.outcome or 'live'} "
                       f"exit={a.exit_code}{under.get(a.attempt, '')} log={a.log_path}")
            if a.attempt in unstarted:
                click.echo(f"     could not start on {a.host}: {unstarted[a.attempt]}")
            if a.memory is not None:
                click.echo(f"     {a.memory.describe()}")
    click.echo("\n" + click.style("events", bold=True))
    for e in events:
        arrow = f"{e.from_status or ''} → {e.to_status or ''}" if e.to_status else ""
        click.echo(f"  {e.at:%Y-%m-%d %H:%M:%S} {e.kind:<17} {arrow} "
                   f"{json.dumps(dict(e.detail)) if e.detail else ''}")


@click.command()
@click.argument("job_id", type=int)
@click.option("--attempt", type=int, help="Which attempt [default: the latest].")
@click.option("-f", "--follow", is_flag=True, help="Keep printing while the attempt runs.")
@pass_state
def logs(state: State, job_id: int, attempt: int | None, follow: bool) -> None:
    """Print an attempt's log (with --server, through the server's log endpoint)."""
    with edge():
        client = state.reader
        job = client.get(job_id)
        number = attempt or job.attempt
        if number < 1:
            fail(f"job {job_id} has not started yet; nothing logged")
        _print_log(client, job_id, number, follow)


def _print_log(client: Operator, job_id: int, number: int, follow: bool) -> None:
    """Print the log from the start; with `follow`, until the attempt is no longer live,
    then what it wrote last."""
    from herder.services.jobs import FOLLOW_INTERVAL

    out = sys.stdout.buffer
    offset = 0
    ended = False
    while True:
        chunk = client.log(job_id, number, offset)
        if chunk:
            out.write(chunk)
            out.flush()
            offset += len(chunk)
            continue  # a chunk is bounded: ask for the rest at once
        if chunk is None and not follow:
            fail(f"job {job_id} attempt {number} has no log (yet)")
        if not follow or ended:
            return
        job = client.get(job_id)
        ended = not (job.attempt == number
                     and job.status in (JobStatus.CLAIMED, JobStatus.RUNNING))
        if not ended:
            time.sleep(FOLLOW_INTERVAL)


# -- changing ---------------------------------------------------------------------------------


@click.command()
@click.argument("job_id", type=int)
@pass_state
def cancel(state: State, job_id: int) -> None:
    """Cancel a job; a running attempt's whole process tree is stopped."""
    with edge():
        status = state.client.cancel(job_id)
    if status in (JobStatus.CLAIMED, JobStatus.RUNNING):
        click.echo(f"job {job_id}: cancel requested; its runner stops it")
    else:
        click.echo(f"job {job_id}: {status}")


@click.command()
@click.argument("job_id", type=int)
@pass_state
def retry(state: State, job_id: int) -> None:
    """Queue a done, failed or cancelled job again with a fresh failure budget."""
    with edge():
        client = state.client
        if not client.retry(job_id):
            fail(f"job {job_id} is {client.get(job_id).status}; only done, failed or "
                 "cancelled jobs can be retried")
    click.echo(f"job {job_id}: queued")


@click.command("should-dispatch")
@click.argument("dedup_key")
@click.option("--type", "job_type", help="Also run this job type's dispatch_check.")
@click.option("-p", "--param", "params", multiple=True, metavar="FIELD=VALUE",
              help="A payload field for the check, as $HERDER_PAYLOAD_<FIELD> (repeatable).")
@pass_state
def should_dispatch(state: State, dedup_key: str, job_type: str | None,
                    params: Sequence[str]) -> None:
    """Exit 0 if no job holds KEY (dispatch), 10 if one does or --type's dispatch_check says
    skip (the reason printed), 2 on error (the check failing too)."""
    with edge():
        if not dedup_key:  # no job holds one: it would always say dispatch
            raise InputError("KEY", "is empty",
                             "pass the dedup key the job would be submitted with")
        payload = _named_values(params, "-p", "FIELD=VALUE", "write -p issue=42")
        if params and job_type is None:
            raise InputError("-p", "a payload is for a job type's dispatch_check",
                             "pass --type NAME too")
        client = state.client
        holder = client.should_dispatch(dedup_key)
        reason = None
        if holder is None and job_type is not None:
            reason = client.dispatch_check(job_type, dedup_key, payload)
    if holder is not None:
        job_id, status = holder
        click.echo(f"skip: job {job_id} is {status} with dedup key {dedup_key!r}")
        sys.exit(EXIT_SKIP)
    if reason is not None:
        click.echo(f"skip: {reason} (job_types.{job_type}.dispatch_check)")
        sys.exit(EXIT_SKIP)
    click.echo(f"dispatch: no job holds {dedup_key!r}")
