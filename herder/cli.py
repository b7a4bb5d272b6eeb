"""The `herder` command. Usage errors exit 2 with the field and the fix, and change nothing."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console
from rich.table import Table

from herder.client import Client
from herder.config import CONFIG_FILE, Config, load_config, parse_duration, sample_config
from herder.errors import HerderError, InputError, NotFound
from herder.intake import parse_assignments, parse_payload
from herder.model import JobStatus
from herder.runtime.runner import Runner, RunnerOptions, default_host
from herder.store import as_unavailable
from herder.views import attempt_view, event_view, job_view

EXIT_USAGE = 2
EXIT_SKIP = 10
F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    one_line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    click.echo(f"herder: error: {one_line}", err=True)
    sys.exit(code)


def fail_if_unavailable(error: Exception) -> None:
    """Exit 2 with one line when `error` is the database failing; return otherwise."""
    unavailable = as_unavailable(error)
    if unavailable is not None:
        fail(f"{unavailable} (retry when the database is back)")


@contextmanager
def edge() -> Iterator[None]:
    """Turn herder's errors into one clear line on stderr and exit 2; so too a database
    that fails after connect (down, restarting, locked, an I/O error)."""
    try:
        yield
    except (InputError, NotFound) as exc:
        fail(str(exc))
    except HerderError as exc:
        fail(str(exc))
    except Exception as exc:
        fail_if_unavailable(exc)
        raise


class State:
    def __init__(self, db: str | None, config_path: str | None) -> None:
        self.db = db
        self.config_path = config_path
        self._config: Config | None = None
        self._client: Client | None = None

    @property
    def config(self) -> Config:
        if self._config is None:
            self._config = load_config(self.config_path)
        return self._config

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.db, self.config)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


pass_state = click.make_pass_decorator(State)


class HerderGroup(click.Group):
    """Click's usage errors as one line too (`herder: error: ...`), exit 2."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        try:
            code = super().main(*args, **kwargs)
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else "", err=True)
            sys.exit(EXIT_USAGE)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx else "herder"
            fail(f"{exc.format_message()} (see `{where} --help`)")
        except click.ClickException as exc:
            fail(exc.format_message(), exc.exit_code)
        except click.Abort:
            fail("aborted", 1)
        except Exception as exc:  # a command outside `edge()`: database failures still one line
            fail_if_unavailable(exc)
            raise
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=HerderGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", envvar="HERDER_DB", help="sqlite:///path or postgresql://... "
              "[env HERDER_DB; default ./herder.db]")
@click.option("--config", "config_path", envvar="HERDER_CONFIG", type=click.Path(),
              help="herder.toml to use [env HERDER_CONFIG; default ./herder.toml]")
@click.version_option(package_name="herder")
@click.pass_context
def main(ctx: click.Context, db: str | None, config_path: str | None) -> None:
    """herder: a job queue and dispatcher for long-running command-line jobs."""
    state = State(db, config_path)
    ctx.obj = state
    ctx.call_on_close(state.close)


# -- init / migrate ---------------------------------------------------------------------------


@main.command()
@click.option("--force", is_flag=True, help="Overwrite an existing herder.toml.")
@click.argument("directory", type=click.Path(file_okay=False), default=".")
def init(directory: str, force: bool) -> None:
    """Write a commented sample herder.toml."""
    target = Path(directory) / CONFIG_FILE
    if target.exists() and not force:
        fail(f"{target} already exists (pass --force to overwrite it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(sample_config())
    click.echo(f"wrote {target}")


@main.command()
@pass_state
def migrate(state: State) -> None:
    """Apply pending schema migrations (also done on every start)."""
    with edge():
        store = state.client.store
        click.echo(f"schema version {store.schema_version()} ({store.dialect})")


# -- submit -----------------------------------------------------------------------------------


class SubmitCommand(click.Command):
    """Everything after `--` is the ad-hoc command, passed through untouched."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            index = args.index("--")
            ctx.meta["herder.command"] = args[index + 1 :]
            args = args[:index]
        return super().parse_args(ctx, args)


def _duration(value: str | None, field: str) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise InputError(field, str(exc)) from exc


@main.command(cls=SubmitCommand)
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
    state: State = ctx.obj
    command: list[str] | None = ctx.meta.get("herder.command")
    with edge():
        body: dict[str, Any] = parse_payload(payload) if payload else {}
        body.update(parse_assignments(params))
        env: dict[str, str] = {}
        for pair in env_pairs:
            name, sep, value = pair.partition("=")
            if not sep or not name:
                raise InputError("--env", f"{pair!r} is not NAME=VALUE", "write --env KEY=value")
            env[name] = value
        delay_seconds = _duration(delay, "--delay")
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
            max_attempts=max_attempts, timeout_seconds=_duration(timeout, "--timeout"),
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
    seconds = (datetime.now(UTC) - value).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(int(seconds), 0)}s"


@main.command()
@click.option("--status", "statuses", multiple=True,
              type=click.Choice([s.value for s in JobStatus]), help="Only these (repeatable).")
@click.option("--limit", type=click.IntRange(1, 100_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of job objects.")
@pass_state
def jobs(state: State, statuses: Sequence[str], limit: int, as_json: bool) -> None:
    """List jobs, newest first."""
    with edge():
        found = state.client.list([JobStatus(s) for s in statuses] or None, limit)
    if as_json:
        click.echo(json.dumps([job_view(job) for job in found], indent=2))
        return
    table = Table(box=None, header_style="bold")
    for column in ("ID", "STATUS", "TYPE", "PRI", "WEIGHT", "ATT", "HOST", "AGE", "COMMAND"):
        table.add_column(column)
    for job in found:
        table.add_row(str(job.id), job.status.value, job.job_type, str(job.priority),
                      job.weight, f"{job.attempt}/{job.max_attempts}", job.host or "-",
                      _age(job.created_at), " ".join(job.command)[:60])
    Console().print(table)


@main.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="The job, its attempts and events.")
@pass_state
def show(state: State, job_id: int, as_json: bool) -> None:
    """Show one job with its attempts and history."""
    with edge():
        client = state.client
        job = client.get(job_id)
        attempts = client.attempts(job_id)
        events = client.events(job_id)
    view = job_view(job)
    view["attempts"] = [attempt_view(a) for a in attempts]
    view["events"] = [event_view(e) for e in events]
    if as_json:
        click.echo(json.dumps(view, indent=2))
        return
    console = Console()
    for key in ("id", "status", "job_type", "priority", "weight", "attempt", "max_attempts",
                "host", "exit_code", "failure_reason", "dedup_key", "command", "workdir",
                "created_at", "started_at", "finished_at", "available_at"):
        value = view[key]
        if value is not None:
            console.print(f"[bold]{key:>15}[/bold]  {value}", highlight=False)
    if attempts:
        console.print("\n[bold]attempts[/bold]")
        for a in attempts:
            console.print(f"  #{a.attempt} {a.host} pid={a.pid} {a.outcome or 'live'} "
                          f"exit={a.exit_code} log={a.log_path}", highlight=False)
    console.print("\n[bold]events[/bold]")
    for e in events:
        arrow = f"{e.from_status or ''} → {e.to_status or ''}" if e.to_status else ""
        console.print(f"  {e.at:%Y-%m-%d %H:%M:%S} {e.kind:<17} {arrow} "
                      f"{json.dumps(dict(e.detail)) if e.detail else ''}", highlight=False)


@main.command()
@click.argument("job_id", type=int)
@click.option("--attempt", type=int, help="Which attempt [default: the latest].")
@click.option("-f", "--follow", is_flag=True, help="Keep printing while the attempt runs.")
@pass_state
def logs(state: State, job_id: int, attempt: int | None, follow: bool) -> None:
    """Print an attempt's log."""
    with edge():
        client = state.client
        job = client.get(job_id)
        number = attempt or job.attempt
        if number < 1:
            fail(f"job {job_id} has not started yet; nothing logged")
        records = {a.attempt: a for a in client.attempts(job_id)}
        record = records.get(number)
        if record is None:
            fail(f"job {job_id} has no attempt {number}")
        path = Path(record.log_path) if record.log_path else (
            client.config.log_dir / str(job_id) / f"{number}.log")
        _print_log(client, job_id, number, path, follow)


def _print_log(client: Client, job_id: int, number: int, path: Path, follow: bool) -> None:
    out = sys.stdout.buffer
    offset = 0
    while True:
        if path.exists():
            with open(path, "rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
            if chunk:
                out.write(chunk)
                out.flush()
                offset += len(chunk)
        if not follow:
            if not path.exists():
                fail(f"log {path} does not exist (yet)")
            return
        job = client.get(job_id)
        live = job.attempt == number and job.status in (JobStatus.CLAIMED, JobStatus.RUNNING)
        if not live:
            if path.exists():
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    rest = handle.read()
                out.write(rest)
                out.flush()
            return
        time.sleep(0.2)


# -- changing ---------------------------------------------------------------------------------


@main.command()
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


@main.command()
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


@main.command("should-dispatch")
@click.argument("dedup_key")
@pass_state
def should_dispatch(state: State, dedup_key: str) -> None:
    """Exit 0 if no job holds KEY (dispatch), 10 if one does (skip; reason printed), 2 on error."""
    with edge():
        holder = state.client.should_dispatch(dedup_key)
    if holder is None:
        click.echo(f"dispatch: no job holds {dedup_key!r}")
        return
    job_id, status = holder
    click.echo(f"skip: job {job_id} is {status} with dedup key {dedup_key!r}")
    sys.exit(EXIT_SKIP)


# -- running ----------------------------------------------------------------------------------


@main.command()
@click.option("--concurrency", type=click.IntRange(1, 1024),
              help="Attempts at once [default: runtime.concurrency, 4].")
@click.option("--host", help="This machine's label [default: hostname].")
@click.option("--exit-when-idle", is_flag=True,
              help="Exit 0 once nothing is queued, claimed or running.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
@pass_state
def up(state: State, concurrency: int | None, host: str | None, exit_when_idle: bool,
       log_level: str) -> None:
    """Run jobs on this machine: coordinator and local executor in one process."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with edge():
        config = state.config
        runtime = config.settings.runtime
        store = state.client.store
        options = RunnerOptions(
            host=host or config.settings.herder.host or default_host(),
            log_dir=config.log_dir,
            concurrency=concurrency or runtime.concurrency,
            heartbeat_interval=runtime.heartbeat_interval,
            attempt_lease=runtime.attempt_lease,
            kill_grace=runtime.kill_grace,
            poll_interval=runtime.poll_interval,
            max_lost=runtime.max_lost,
            pass_env=tuple(runtime.pass_env), fence_margin=runtime.fence_margin,
            exit_when_idle=exit_when_idle,
        )
        sys.exit(Runner(store, options).run())


import herder.cli_fleet  # noqa: E402, F401  (registers the fleet commands on `main`)

if __name__ == "__main__":
    # `python -m herder.cli` runs this file as `__main__`, a second copy of the module;
    # herder.cli_fleet registered its commands on the importable `herder.cli.main`.
    from herder.cli import main as registered_main

    registered_main()
