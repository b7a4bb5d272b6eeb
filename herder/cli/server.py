"""Commands that run the work: up (one machine), server (the fleet coordinator), demo."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

import click

from herder.cli.root import LOG_FORMAT_OPTION, State, edge, fail, log_to_stderr, pass_state
from herder.core.errors import InputError

STARTUP_FAILURE = 3
"""uvicorn's exit status when its server never started."""
LEGACY_TOKEN_LENGTH = 32
"""The shortest HERDER_API_TOKEN a server accepts."""
PLAINTEXT_OPTION = click.option(
    "--allow-plaintext", is_flag=True, envvar="HERDER_ALLOW_PLAINTEXT",
    help="Serve plain http off loopback (a network you trust) [env HERDER_ALLOW_PLAINTEXT].")

if TYPE_CHECKING:
    import socket

    import uvicorn

    from herder.api.depends import Access
    from herder.core.settings.sections import Settings
    from herder.runtime.coordinator import Coordinator
    from herder.store import Store


@click.command()
@click.option("--concurrency", type=click.IntRange(1, 1024),
              help="Attempts at once [default: runtime.concurrency, 4].")
@click.option("--host", help="This machine's label [default: hostname].")
@click.option("--exit-when-idle", is_flag=True,
              help="Exit 0 once nothing is queued, claimed or running.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
@click.option("--ui", is_flag=True,
              help="Serve the dashboard too; on loopback, print a one-time sign-in link.")
@click.option("--ui-listen", metavar="HOST:PORT", default="127.0.0.1:8471", show_default=True,
              help="Where --ui serves the dashboard.")
@PLAINTEXT_OPTION
@LOG_FORMAT_OPTION
@pass_state
def up(state: State, concurrency: int | None, host: str | None, exit_when_idle: bool,
       ui: bool, ui_listen: str, allow_plaintext: bool, log_level: str,
       log_format: str) -> None:
    """Run jobs on this machine: coordinator and local executor in one process."""
    from herder.runtime.hardening import harden_process

    harden_process()  # first: the imports below take tens of milliseconds
    import threading
    import time

    from herder.runtime.delivery import start_alerts
    from herder.runtime.guardian import start_guardian
    from herder.runtime.job_user import job_user_at_start
    from herder.runtime.runner import Runner, utcnow
    from herder.runtime.runner_options import RunnerOptions, default_host

    log_to_stderr(log_level, log_format)
    with edge():
        config = state.config
        private_files(state)
        # Before the store's threads: the watchdog that stops this runner's jobs if it dies
        # or freezes, before another runner may take them over.
        guardian = start_guardian(config.settings.runtime.kill_grace)
        store = state.database.store
        job_user_at_start(config.settings.runtime.run_as)  # exit 2 naming the key
        options = RunnerOptions.from_settings(
            config.settings, host or config.settings.herder.host or default_host(),
            config.log_dir, concurrency=concurrency, exit_when_idle=exit_when_idle)
        runner = Runner(store, options)
        runner.source.guardian = guardian
        start_accounts(store, config.settings, options.host)
        dashboard = (serve_dashboard(state, ui_listen, options.host, allow_plaintext)
                     if ui else None)
        alerts = start_alerts(store, config.settings.alerts, threading.Event(), utcnow,
                              lambda: True, lambda: time.monotonic() - runner.last_turn,
                              silence_key=f"runner:{options.host}:silent")
    code = runner.run()
    if dashboard is not None:
        dashboard.should_exit = True
    if alerts is not None:
        alerts.close(flush_seconds=config.settings.alerts.timeout)
    sys.exit(code)


def private_files(state: State) -> None:
    """Before the store's threads and any child: the database file and the log folder
    private to herder's user (an older herder made them 0644 / 0755), and the secret
    variables out of the environment (read already, or read through `secret_value`)."""
    from herder.runtime.hardening import (
        private_folder,
        secret_variables,
        tighten_sqlite,
        withdraw_secrets,
    )

    config = state.config
    tighten_sqlite(config.db_url(state.db))
    private_folder(config.log_dir, "herder.log_dir")
    withdraw_secrets(secret_variables(config.settings))


def listen_address(option: str, address: str) -> tuple[str, int]:
    """HOST:PORT of a listen option; exit 2 naming the option otherwise."""
    bind, _, port_text = address.rpartition(":")
    if not bind or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InputError(option, f"{address!r} is not HOST:PORT", "e.g. 127.0.0.1:8470")
    if ":" in bind and not (bind.startswith("[") and bind.endswith("]")):
        # `::1:8470` would listen, but every URL built from it (the link, public_url) breaks.
        raise InputError(option, f"{address!r}: an IPv6 address needs brackets",
                         f"write [{bind}]:{port_text}")
    return bind, int(port_text)


def require_admin_or_loopback(store: Store, bind: str, option: str, legacy: str | None,
                              open_access: bool) -> None:
    """Off loopback, a server needs an admin token first (or anyone could sign in to
    nothing, and an operator could not either); on loopback, say that sign-in needs one."""
    from herder.core.access import active_admins

    if active_admins(store.token_list()) or legacy or open_access:
        return
    if not loopback(bind):
        raise InputError(option, f"{bind} is reachable from the network and no admin token "
                         "exists", "create one first: herder token create --scope admin "
                         "--name ops")
    logging.getLogger("herder.server").warning(
        "no admin token exists: operator routes answer 401 until one is created "
        "(herder token create --scope admin)")


def serve_dashboard(state: State, address: str, label: str, allow_plaintext: bool) -> Any:
    """`up --ui`: the dashboard (and the API's read routes, cancel, retry, drain) over the
    same store, on a thread of its own; the runner keeps doing the scheduling. Returns the
    uvicorn server, whose `should_exit` stops it."""
    import threading
    import time

    import uvicorn

    from herder.api.app import Access, create_app
    from herder.api.guard import proxy_options
    from herder.api.signin import offer_link
    from herder.core.urls import listen_url
    from herder.runtime.coordinator import Coordinator

    bind, port = listen_address("--ui-listen", address)
    store = state.database.store
    require_admin_or_loopback(store, bind, "--ui-listen", None, False)
    settings = state.config.settings.server
    check_plaintext(bind, "--ui-listen", False, plaintext_allowed(state, allow_plaintext))
    coordinator = Coordinator(store, state.config, label)
    app = create_app(coordinator, edge_access(Access(), bind, settings.public_url),
                     run_coordinator=False)
    server = uvicorn.Server(uvicorn.Config(app, host=bind.strip("[]"), port=port,
                                           log_level="warning",
                                           log_config=None, timeout_graceful_shutdown=2,
                                           **proxy_options(os.environ)))
    # Before the first request: a loopback dashboard offers a one-time sign-in link.
    base = listen_url("http", (bind.strip("[]"), port))
    link = offer_link(app, base) if loopback(bind) else None
    thread = threading.Thread(target=server.run, name="herder-dashboard", daemon=True)
    thread.start()
    while not server.started:  # listening, or failed to (the port is taken)
        if not thread.is_alive():
            raise InputError("--ui-listen", f"cannot listen on {address}",
                             "pick a free port, e.g. --ui-listen 127.0.0.1:8472")
        time.sleep(0.02)
    logging.getLogger("herder.server").info(
        "dashboard on %s/ui/%s", base,
        "" if link is None else " (its one-time sign-in link is on standard output)")
    if link is not None:
        print_link(link)
    return server


def print_link(link: str) -> None:
    """A one-time sign-in link, on standard output (flushed: a parent may be reading it
    through a pipe), never in the log."""
    from herder.core.signin import CODE_SECONDS

    click.echo("Open the dashboard (this link signs in once, within "
               f"{CODE_SECONDS // 60} minutes): {link}")
    sys.stdout.flush()


def plaintext_allowed(state: State, flag: bool) -> bool:
    """--allow-plaintext on the command or before it (HERDER_ALLOW_PLAINTEXT), or
    [server] allow_plaintext."""
    return flag or state.allow_plaintext or state.config.settings.server.allow_plaintext


def check_plaintext(bind: str, option: str, tls: bool, allowed: bool) -> None:
    """Off loopback, a server without TLS would carry tokens, logs and account credentials
    in clear text: exit 2 unless --allow-plaintext ([server] allow_plaintext) says so."""
    if tls or allowed or loopback(bind):
        return
    raise InputError(option, f"{bind} is reachable from the network and the server has no "
                     "TLS: tokens and account credentials would cross it in clear text",
                     "pass --tls-cert and --tls-key (or listen on 127.0.0.1 behind a TLS "
                     "proxy), or --allow-plaintext on a network you trust")


def check_legacy_token(variable: str, value: str | None) -> None:
    """The deprecated admin variable must be a long random value (never echoed)."""
    if value is not None and len(value) < LEGACY_TOKEN_LENGTH:
        raise InputError(variable, f"is shorter than {LEGACY_TOKEN_LENGTH} characters",
                         "set it to a random value, e.g. `openssl rand -hex 32`, or unset it "
                         "and use `herder token create --scope admin`")


def edge_access(access: Access, bind: str, public_url: str | None) -> Access:
    """`access` with what the listening address and [server] public_url decide: a loopback
    server answers only loopback (or public_url's) Host values, and an https public_url
    makes the session cookie Secure."""
    import msgspec

    from herder.api.guard import url_host

    return msgspec.structs.replace(
        access, loopback_names=url_host(public_url) if loopback(bind) else None,
        secure_cookie=(public_url or "").lower().startswith("https://"))


def start_accounts(store: Store, settings: Settings, host: str) -> None:
    """Declare herder.toml's accounts and probe this host's in a thread of their own (a
    probe may take its whole timeout; the runner's loop must not wait for it)."""
    import threading

    from herder.runtime.accounts import probe_loop, sync_accounts
    from herder.runtime.runner import utcnow

    sync_accounts(store, settings, utcnow())
    threading.Thread(target=probe_loop, args=(store, settings, host, threading.Event(),
                                              utcnow), name="herder-probes", daemon=True).start()


def loopback(bind: str) -> bool:
    from herder.core.urls import loopback_name

    return loopback_name(bind)


@click.group(invoke_without_command=True)
@click.option("--listen", help="HOST:PORT [default: server.listen, 127.0.0.1:8470].")
@click.option("--host", "label", help="This machine's label [default: hostname].")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False))
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False))
@click.option("--insecure-no-auth", is_flag=True,
              help="Loopback only: operator routes need no token (agents still need theirs).")
@click.option("--sign-in-link", is_flag=True,
              help="Loopback only: once listening, print a one-time dashboard sign-in link on "
                   "standard output (what `herder demo --ui` opens). Under systemd standard "
                   "output is the journal, which others may read: use it for interactive "
                   "runs only.")
@PLAINTEXT_OPTION
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
@LOG_FORMAT_OPTION
@click.pass_context
def server(ctx: click.Context, listen: str | None, label: str | None, tls_cert: str | None,
           tls_key: str | None, insecure_no_auth: bool, sign_in_link: bool,
           allow_plaintext: bool, log_level: str, log_format: str) -> None:
    """The fleet coordinator: store, scheduler (one leader among replicas), HTTP API."""
    if ctx.invoked_subcommand is not None:
        return
    state: State = ctx.obj
    from herder.runtime.hardening import check_secret_file, harden_process, hook_secrets

    harden_process()  # first: the imports below take tens of milliseconds
    import uvicorn

    from herder.api.app import Access, create_app
    from herder.api.guard import proxy_options
    from herder.api.signin import offer_link
    from herder.core.urls import listen_url
    from herder.runtime.coordinator import Coordinator
    from herder.runtime.delivery import check_urls
    from herder.runtime.job_user import job_user_at_start
    from herder.services.host_settings import check_declared_hosts

    log_to_stderr(log_level, log_format)
    log = logging.getLogger("herder.server")
    with edge():
        settings = state.config.settings.server
        address = listen or settings.listen
        bind, port = listen_address("--listen", address)
        cert = tls_cert or settings.tls_cert
        key = tls_key or settings.tls_key
        if bool(cert) != bool(key):
            raise InputError("--tls-cert", "TLS needs both a certificate and a key",
                             "pass --tls-cert and --tls-key together")
        if key:
            check_secret_file(key, "--tls-key" if tls_key else "server.tls_key")
        check_declared_hosts(state.config)  # exit 2 naming the key, before any is stored
        runtime = state.config.settings.runtime
        if runtime.run_as is not None or any(
                host.transport == "local" for host in state.config.settings.hosts.values()):
            job_user_at_start(runtime.run_as)  # its local hosts' agents run jobs here
        legacy = os.environ.get(settings.api_token_env) or None
        check_legacy_token(settings.api_token_env, legacy)
        secrets = hook_secrets(state.config, os.environ)  # none missing, or no start
        private_files(state)
        if sign_in_link and not loopback(bind):
            raise InputError("--sign-in-link", f"{bind} is not a loopback address, and a "
                             "sign-in link works only on loopback",
                             "listen on 127.0.0.1, or sign in with a token instead")
        if insecure_no_auth and not loopback(bind):
            raise InputError("--insecure-no-auth", f"{bind} is reachable from the network",
                             "listen on 127.0.0.1, or drop --insecure-no-auth and use tokens")
        require_admin_or_loopback(state.database.store, bind, "--listen", legacy,
                                  insecure_no_auth)
        allow_plaintext = plaintext_allowed(state, allow_plaintext)
        check_plaintext(bind, "--listen", bool(cert), allow_plaintext)
        if legacy:
            log.warning("%s is deprecated: it works as an admin token; create a scoped token "
                        "with `herder token create` and unset it", settings.api_token_env)
        if insecure_no_auth:
            log.warning("--insecure-no-auth: anyone who can reach %s has admin rights", address)
        check_urls(state.config.settings.alerts)  # exit 2 naming the key, before listening
        coordinator = Coordinator(state.database.store, state.config, label)
        if not coordinator.public_url:
            scheme = "https" if cert else "http"
            coordinator.public_url = f"{scheme}://{bind}:{port}"
        coordinator.allow_plaintext = allow_plaintext
        app = create_app(coordinator, edge_access(
            Access(open_access=insecure_no_auth, legacy_admin_token=legacy,
                   max_body_bytes=settings.max_body_bytes, hook_secrets=secrets),
            bind, settings.public_url))
        # Before the first request; printed once listening (the port is then known good).
        link = (offer_link(app, listen_url("https" if cert else "http",
                                           (bind.strip("[]"), port)))
                if sign_in_link else None)
    # JSON logs: uvicorn's own loggers go through ours (one format a line), not its config.
    extra: dict[str, Any] = {"log_config": None} if log_format == "json" else {}
    served = announcing_server(uvicorn.Config(
        app, host=bind.strip("[]"), port=port, log_level="warning", ssl_certfile=cert,
        ssl_keyfile=key, timeout_graceful_shutdown=5, **proxy_options(os.environ), **extra),
        "https" if cert else "http",
        log, coordinator, link)
    with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run
        served.run()
    if not served.started:
        sys.exit(STARTUP_FAILURE)
    if coordinator.fatal is not None:
        fail(f"{coordinator.fatal} (exiting so a supervisor restarts the server)", 1)



ENVIRONMENT_FILE = "/etc/herder/server.env"
UNIT_FILE = "/etc/systemd/system/herder-server.service"


@server.command("install-systemd")
@click.option("--listen", help="HOST:PORT for the unit's server [default: server.listen].")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False),
              help="The certificate the unit's server serves (an absolute path is written).")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False))
@click.option("--user", default="herder", show_default=True,
              help="The dedicated user the server runs as (create it: useradd --system herder).")
@click.option("--workdir", type=click.Path(file_okay=False),
              help="Its working directory [default: the config's folder, else here].")
@click.option("--unit-file", default=UNIT_FILE, show_default=True, type=click.Path())
@click.option("--env-file", "environment_file", default=ENVIRONMENT_FILE, show_default=True,
              type=click.Path(), help="Written mode 0600: HERDER_DB and the secrets "
              "herder.toml names by variable, from this environment.")
@click.option("--print", "print_only", is_flag=True,
              help="Print the unit instead; write nothing (the environment file neither).")
@PLAINTEXT_OPTION
@pass_state
def install_systemd(state: State, listen: str | None, tls_cert: str | None,
                    tls_key: str | None, user: str, workdir: str | None, unit_file: str,
                    environment_file: str, print_only: bool, allow_plaintext: bool) -> None:
    """Write a systemd unit (Restart=on-failure) for `herder server`, and its environment
    file with the database URL (never on the command line or in the unit)."""
    from herder.cli.root import installed_herder
    from herder.cli.systemd_unit import environment_line, render, server_unit

    with edge():
        for option, path in (("--unit-file", unit_file), ("--env-file", environment_file)):
            if not os.path.isabs(path):
                raise InputError(option, f"{path!r} is not an absolute path",
                                 "systemd needs one, e.g. " + (UNIT_FILE if option ==
                                                               "--unit-file" else
                                                               ENVIRONMENT_FILE))
        if bool(tls_cert) != bool(tls_key):
            raise InputError("--tls-cert", "TLS needs both a certificate and a key",
                             "pass --tls-cert and --tls-key together")
        if listen is not None:
            listen_address("--listen", listen)
        config = state.config  # a broken herder.toml ends here, not at the unit's start
        settings = config.settings.server
        bind, _port = listen_address("--listen", listen or settings.listen)
        allow_plaintext = plaintext_allowed(state, allow_plaintext)
        check_plaintext(bind, "--listen", bool(tls_cert or settings.tls_cert), allow_plaintext)
        options: list[str] = []
        if listen:
            options += ["--listen", listen]
        if allow_plaintext and not settings.allow_plaintext:
            options.append("--allow-plaintext")
        if tls_cert and tls_key:
            options += ["--tls-cert", os.path.abspath(tls_cert),
                        "--tls-key", os.path.abspath(tls_key)]
        folder = workdir or (str(config.path.resolve().parent) if config.path else os.getcwd())
        config_file = str(config.path.resolve()) if config.path is not None else None
        unit = render(server_unit(installed_herder(), config_file, options, user,
                                  os.path.abspath(folder), environment_file))
        if print_only:
            click.echo(unit, nl=False)
            click.echo(f"herder: put HERDER_DB=<database URL> in {environment_file} (owned by "
                       "root, mode 0600)", err=True)
            return
        variables = server_variables(state)
        lines = [environment_line(name, value) for name, value in variables.items()]
        for option, path in (("--env-file", environment_file), ("--unit-file", unit_file)):
            try:
                if option == "--env-file":
                    write_private(path, "".join(line + "\n" for line in lines))
                else:
                    with open(path, "w", encoding="utf-8") as out:
                        out.write(unit)
            except OSError as exc:
                raise InputError(option, f"cannot write {path}: {exc.strerror or exc}",
                                 "run it as root, or pass --print") from None
    click.echo(f"wrote {unit_file} and {environment_file} (mode 0600: "
               f"{', '.join(variables)})", err=True)
    click.echo(f"next: systemctl daemon-reload && systemctl enable --now "
               f"{os.path.basename(unit_file)}", err=True)


def server_variables(state: State) -> dict[str, str]:
    """What the unit's server reads from its environment: HERDER_DB, and each secret
    variable herder.toml names (webhook secrets, alert URLs), as this shell has them."""
    if not state.db:
        raise InputError("--db", "no database URL to write into the environment file",
                         "set HERDER_DB (or pass --db) to the server's database URL")
    settings = state.config.settings
    names = [source.secret_env for source in settings.hooks.sources.values()
             if source.secret_env is not None]
    if settings.alerts.urls_env:
        names.append(settings.alerts.urls_env)
    missing = [name for name in names if not os.environ.get(name)]
    if missing:
        raise InputError(missing[0], "is not set here; herder.toml names it and the server "
                         "needs it", f"export {missing[0]} and run this again")
    return {"HERDER_DB": state.db, **{name: os.environ[name] for name in names}}


def write_private(path: str, text: str) -> None:
    """Write a file only its owner may read (mode 0600 from the start, no moment where
    others could)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        os.fchmod(out.fileno(), 0o600)
        out.write(text)


def announcing_server(config: uvicorn.Config, scheme: str, log: logging.Logger,
                      coordinator: Coordinator | None = None,
                      link: str | None = None) -> uvicorn.Server:
    """A uvicorn server that logs "listening on URL" once its sockets are bound, with the
    address and port they really have (uvicorn's own line is off at log level warning).
    With a coordinator: its local hosts' agents get a plain-HTTP loopback URL of the API
    (the listener itself when it is one, else one more on 127.0.0.1, port chosen by the
    kernel), and are stopped while the API still answers them. A sign-in `link` is printed
    once listening (`server --sign-in-link`)."""
    import asyncio

    import uvicorn

    from herder.core.urls import listen_url

    class Announcing(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if not self.started:
                return
            bound = [sock.getsockname() for server in self.servers
                     for sock in server.sockets]
            for name in bound:
                url = listen_url(scheme, name)
                log.info("listening on %s", url,
                         extra={"event": "server_listening", "url": url})
            if coordinator is not None:
                coordinator.local_hosts.serve_local_at(await self.loopback_url(bound))
            if link is not None:
                log.info("dashboard on %s (its one-time sign-in link is on standard output)",
                         link.partition("?")[0])
                print_link(link)

        async def loopback_url(self, bound: list[tuple[object, ...]]) -> str:
            """Where the local hosts' agents reach the API over plain loopback HTTP."""
            for name in bound:
                if scheme == "http" and isinstance(name, tuple) and loopback(str(name[0])):
                    return listen_url("http", name)
            settings, state, lifespan = self.config, self.server_state, self.lifespan

            def protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
                return settings.http_protocol_class(  # type: ignore[call-arg]
                    config=settings, server_state=state, app_state=lifespan.state,
                    _loop=_loop)

            extra = await asyncio.get_running_loop().create_server(
                protocol, host="127.0.0.1", port=0, backlog=settings.backlog)
            self.servers.append(extra)  # closed with the others at shutdown
            url = listen_url("http", extra.sockets[0].getsockname())
            log.info("local hosts' agents reach the API on %s", url)
            return url

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            if coordinator is not None:
                await asyncio.to_thread(coordinator.stop_local)
            await super().shutdown(sockets)

    return Announcing(config)


@click.command()
@click.option("--ui", is_flag=True,
              help="Serve the dashboard, open it in a browser where there is one (its "
                   "one-time sign-in link is printed in any case), and run slower jobs.")
@click.option("--keep", is_flag=True,
              help="Keep the fleet running after the workload, until Ctrl-C.")
@click.option("--keep-folder", is_flag=True,
              help="Keep the demo's folder (database, herder.toml, logs) when it stops.")
@click.option("--port", type=click.IntRange(0, 65535), default=0,
              help="The server's port on 127.0.0.1 [default: a free one; a taken one is "
                   "replaced by a free one].")
@click.option("--no-browser", is_flag=True, help="With --ui: print the link, open nothing.")
def demo(ui: bool, keep: bool, keep_folder: bool, port: int, no_browser: bool) -> None:
    """See a fleet work: a server, three agents posing as hosts, a mixed workload."""
    from herder.cli.demo import run_demo

    sys.exit(run_demo(click.echo, keep=keep, keep_folder=keep_folder, ui=ui, port=port,
                      browser=not no_browser))
