"""The root `herder` group and what every command module shares: the error edge, the
lazily built state, small parsers. Command modules import this one, never each other.

Scripts run `herder submit` and `should-dispatch` in loops, so a command loads only its own
module (see COMMANDS) and each module imports its heavy dependencies where they are used.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn

import click

from herder.core.errors import HerderError, InputError, NotFound

if TYPE_CHECKING:
    from herder.core.model import HostRecord
    from herder.core.settings.loading import Config
    from herder.services.operations import Operations
    from herder.services.operator import Operator
    from herder.services.remote import RemoteClient
    from herder.store import Store

EXIT_USAGE = 2
DEFAULT_TOKEN_FILE = "~/.config/herder/agent-token"
"""Where a host's agent token is read from by default (agent, heartbeat, doctor --agent)."""
EXIT_SKIP = 10

COMMANDS: dict[str, str] = {
    "init": "herder.cli.project:init",
    "migrate": "herder.cli.project:migrate",
    "submit": "herder.cli.jobs:submit",
    "jobs": "herder.cli.jobs:jobs",
    "show": "herder.cli.jobs:show",
    "logs": "herder.cli.jobs:logs",
    "cancel": "herder.cli.jobs:cancel",
    "retry": "herder.cli.jobs:retry",
    "should-dispatch": "herder.cli.jobs:should_dispatch",
    "up": "herder.cli.server:up",
    "hosts": "herder.cli.hosts:hosts",
    "host": "herder.cli.hosts:host",
    "ram": "herder.cli.hosts:ram",
    "fleet": "herder.cli.fleet:fleet",
    "why": "herder.cli.hosts:why_command",
    "accounts": "herder.cli.accounts:accounts",
    "alerts": "herder.cli.alerts:alerts",
    "account": "herder.cli.accounts:account",
    "token": "herder.cli.tokens:token",
    "heartbeat": "herder.cli.agent:heartbeat",
    "slots": "herder.cli.slots:slots",
    "reserve": "herder.cli.slots:reserve",
    "complete": "herder.cli.slots:complete",
    "server": "herder.cli.server:server",
    "agent": "herder.cli.agent:agent",
    "run-attempt": "herder.cli.agent:run_attempt",
    "preflight": "herder.cli.agent:preflight",
    "demo": "herder.cli.server:demo",
    "doctor": "herder.cli.doctor:doctor",
    "simulate": "herder.cli.simulate:simulate",
}
"""Every top-level command: its name and the `module:attribute` that defines it."""


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    one_line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    click.echo(f"herder: error: {one_line}", err=True)
    sys.exit(code)


def known_host(store: Store, label: str) -> HostRecord:
    """The host with this label; exit 2 naming the fix when there is none."""
    record = store.host_get(label)
    if record is None:
        fail(f"no host {label!r} (see `herder hosts`)")
    return record


def fail_if_unavailable(error: Exception) -> None:
    """Exit 2 with one line when `error` is the database failing; return otherwise."""
    from herder.store import as_unavailable

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
    def __init__(self, db: str | None, config_path: str | None, server: str | None = None,
                 token_file: str | None = None, ca: str | None = None,
                 allow_plaintext: bool = False) -> None:
        self.db = db
        self.allow_plaintext = allow_plaintext
        """--allow-plaintext / HERDER_ALLOW_PLAINTEXT: a plain http --server off loopback."""
        self.config_path = config_path
        self.server = server or None
        """--server / HERDER_SERVER: the commands go through this server's HTTP API."""
        self.token_file = token_file
        self.ca = ca
        self._config: Config | None = None
        self._client: Operator | None = None
        self._extra: list[Operations] = []

    @property
    def config(self) -> Config:
        if self._config is None:
            from herder.core.settings.loading import load_config

            self._config = load_config(self.config_path)
        return self._config

    @property
    def client(self) -> Operator:
        """The database's operations, or with --server the HTTP API's client (loaded only
        then)."""
        if self._client is None:
            if self.server is not None:
                self._client = remote_client(self.server, self.token_file, self.ca,
                                             self.allow_plaintext)
            else:
                from herder.services.operations import Operations

                self._client = Operations(self.db, self.config)
        return self._client

    @property
    def store(self) -> Store:
        """The database's store, for a command that works against the database only;
        with --server / HERDER_SERVER it refuses (NotOverServer)."""
        if self.server is not None:
            from herder.services.remote import NotOverServer

            raise NotOverServer()
        return self.database.store

    @property
    def database(self) -> Operations:
        """The database's client whatever --server / HERDER_SERVER say: for the commands
        that run work or set up a store (`up`, `server`, `init`), where a HERDER_SERVER
        meant for the operator commands (or an agent) in the same environment is beside
        the point."""
        from herder.services.operations import Operations

        if isinstance(self._client, Operations):
            return self._client
        if self._extra:
            return self._extra[0]
        client = Operations(self.db, self.config)
        if self._client is None and self.server is None:
            self._client = client
        else:
            self._extra.append(client)
        return client

    @property
    def reader(self) -> Operator:
        """The client of a command that only reads: a SQLite file that does not exist yet
        would be created empty (so its jobs never run), and the note says so."""
        if self._client is not None or self.server is not None:
            return self.client
        new_file = new_sqlite_file(self.config.db_url(self.db))
        client = self.client
        if new_file is not None:
            click.echo(f"herder: note: {new_file} did not exist; created an empty store "
                       "(did you mean to set HERDER_DB, --db or --server?)", err=True)
        return client

    def close(self) -> None:
        for client in self._extra:
            client.close()
        if self._client is not None:
            self._client.close()


pass_state = click.make_pass_decorator(State)


def remote_client(server: str, token_file: str | None, ca: str | None,
                  allow_plaintext: bool = False) -> RemoteClient:
    """The HTTP API's client with an operator token from --token-file / HERDER_TOKEN_FILE,
    else HERDER_TOKEN (never printed)."""
    import os

    from herder.runtime.agent_client import check_server_url, read_token_file
    from herder.services.remote import RemoteClient, plain_http_warning

    with edge():
        url = check_server_url(server, allow_plaintext)
        variable = os.environ.get("HERDER_TOKEN", "").strip()
        if token_file:
            token = read_token_file(os.path.expanduser(token_file), "HERDER_TOKEN")
        elif variable:
            token = variable
        else:
            raise InputError("--token-file", f"no token to talk to {url}",
                             "pass --token-file FILE (mode 0600) or set HERDER_TOKEN; "
                             "`herder token create` makes one")
    warning = plain_http_warning(url)
    if warning:
        click.echo(warning, err=True)
    return RemoteClient(url, token, ca=ca)


def new_sqlite_file(url: str) -> str | None:
    """The SQLite file the URL names when it does not exist yet (opening creates it)."""
    import os

    if not url.startswith("sqlite:"):
        return None
    from herder.store.sqlite import parse_sqlite_url

    with edge():
        path, _ = parse_sqlite_url(url)
    return None if path == ":memory:" or os.path.exists(path) else path


def has_password(url: str) -> bool:
    """Whether a database URL carries a password (`scheme://user:password@host/...`)."""
    _, _, rest = url.partition("://")
    authority = rest.split("/", 1)[0]
    return "@" in authority and ":" in authority.rpartition("@")[0]


def utcnow() -> datetime:
    return datetime.now(UTC)


def duration(value: str | None, field: str) -> float | None:
    """Seconds from an option like `10m`; an InputError naming `field` if it is not one."""
    if value is None:
        return None
    from herder.core.settings.fields import parse_duration

    try:
        return parse_duration(value)
    except ValueError as exc:
        raise InputError(field, str(exc)) from exc


def names(value: str | None) -> frozenset[str] | None:
    """A comma-separated option as a set; None when it names nothing."""
    if value is None:
        return None
    found = frozenset(part.strip() for part in value.split(",") if part.strip())
    return found or None


def installed_herder() -> list[str]:
    """How a systemd unit starts this herder: the `herder` on PATH, else this Python."""
    import shutil

    found = shutil.which("herder")
    return [os.path.abspath(found)] if found else [sys.executable, "-m", "herder.cli"]


def columns(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A table as lines of left-aligned columns two spaces apart, the header first in bold
    (click drops the style when the output is not a terminal). Plain text, so `jobs` loads
    no table library: rich's imports and layout would cost a loop command more than the rest
    of its work (bench/README.md, "Import costs behind the code")."""
    table = [list(header), *(list(row) for row in rows)]
    widths = [max(len(cell) for cell in column) for column in zip(*table, strict=True)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in table]
    return [click.style(lines[0], bold=True), *lines[1:]]


def elapsed(seconds: float) -> str:
    """An age as the tables show it: 12s, 3m, 2h, 1d (whole units, rounded down)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(int(seconds), 0)}s"


def labelled(label: str, value: object) -> str:
    """One `label  value` line of `show`, the label right-aligned in bold."""
    return f"{click.style(f'{label:>18}', bold=True)}  {value}"


def log_to_stderr(level: str, log_format: str = "text") -> None:
    import logging

    from herder.core.log_records import formatter

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    logging.getLogger("httpx").setLevel(logging.WARNING)


LOG_FORMAT_OPTION = click.option(
    "--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
    help="json: one JSON object a line, with the seeds' event names (docs/monitoring.md).")


class LazyCommands(MutableMapping[str, click.Command]):
    """The root group's commands by name; a command's module is imported when the command
    is first looked up, so listing the names imports nothing."""

    def __init__(self, where: dict[str, str]) -> None:
        self.where = dict(where)
        self.loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self.loaded:
            module, _, attribute = self.where[name].partition(":")
            command = getattr(importlib.import_module(module), attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{self.where[name]} is not a click command")
            self.loaded[name] = command
        return self.loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self.loaded[name] = command
        self.where.pop(name, None)

    def __delitem__(self, name: str) -> None:
        if self.loaded.pop(name, None) is None:
            del self.where[name]
        else:
            self.where.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter({**self.where, **self.loaded})

    def __len__(self) -> int:
        return len(self.where.keys() | self.loaded.keys())


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


@click.group(cls=HerderGroup, commands=LazyCommands(COMMANDS),
             context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", envvar="HERDER_DB", help="sqlite:///path or postgresql://... "
              "[env HERDER_DB; default ./herder.db]")
@click.option("--config", "config_path", envvar="HERDER_CONFIG", type=click.Path(),
              help="herder.toml to use [env HERDER_CONFIG; default ./herder.toml]")
@click.option("--server", envvar="HERDER_SERVER", help="Talk to this herder server's API "
              "instead of the database, e.g. https://queue:8470 [env HERDER_SERVER]")
@click.option("--token-file", envvar="HERDER_TOKEN_FILE", help="With --server: the file "
              "holding an operator token, mode 0600 [env HERDER_TOKEN_FILE; or HERDER_TOKEN]")
@click.option("--ca", envvar="HERDER_CA", type=click.Path(exists=True, dir_okay=False),
              help="With --server: the CA that signed its certificate [env HERDER_CA]")
@click.option("--allow-plaintext", is_flag=True, envvar="HERDER_ALLOW_PLAINTEXT",
              help="With --server: accept a plain http URL off loopback (a network you "
              "trust) [env HERDER_ALLOW_PLAINTEXT]")
@click.version_option(package_name="herder")
@click.pass_context
def main(ctx: click.Context, db: str | None, config_path: str | None, server: str | None,
         token_file: str | None, ca: str | None, allow_plaintext: bool) -> None:
    """herder: a job queue and dispatcher for long-running command-line jobs."""
    if db and has_password(db) and ctx.get_parameter_source("db") is \
            click.core.ParameterSource.COMMANDLINE:
        click.echo("herder: warning: --db puts the database password in the command line, "
                   "which every process on this machine can read; it is deprecated: set "
                   "HERDER_DB instead", err=True)
    state = State(db, config_path, server, token_file, ca, allow_plaintext)
    ctx.obj = state
    ctx.call_on_close(state.close)

