"""`herder server install-systemd` and `herder agent install-systemd`: one unit renderer;
the server's unit, started as systemd would start it, serves from the database named only
in its 0600 environment file."""

from __future__ import annotations

import shlex
import shutil
import stat
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from support.cli import run_herder
from support.environment import clean_environment
from support.ports import free_port
from support.processes import StartedProcesses
from support.waits import wait_for

from herder.cli.systemd_unit import (
    Unit,
    agent_unit,
    environment_line,
    exec_line,
    render,
    server_unit,
)
from herder.core.access import new_token, token_hash
from herder.core.errors import InputError
from herder.core.model import Scope
from herder.store import open_store

SECRET_URL = "postgresql://herder:pa%24s%22w0rd@db.internal:5432/herder"


def unit_values(text: str) -> dict[str, list[str]]:
    """The unit's `Key=value` lines (comments skipped), each key's values in order."""
    values: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values.setdefault(key, []).append(value)
    return values


def exec_argv(line: str) -> list[str]:
    """ExecStart as systemd reads it (quotes, then `%%` and `$$` as one character)."""
    return [part.replace("%%", "%").replace("$$", "$") for part in shlex.split(line)]


def environment_of(text: str) -> dict[str, str]:
    """An EnvironmentFile of `NAME="value"` lines, as systemd reads it."""
    found = {}
    for line in text.splitlines():
        name, _, quoted = line.partition("=")
        assert quoted.startswith('"') and quoted.endswith('"'), line
        found[name] = quoted[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    return found


# -- the renderer (pure) ------------------------------------------------------------------------


def test_exec_line_keeps_specifiers_variables_and_spaces_literal():
    line = exec_line(["/opt/my herder/bin/herder", "server", "--config", "/etc/100%/$HOME.toml"])
    assert line == "'/opt/my herder/bin/herder' server --config '/etc/100%%/$$HOME.toml'"
    assert exec_argv(line) == ["/opt/my herder/bin/herder", "server", "--config",
                               "/etc/100%/$HOME.toml"]


def test_an_environment_line_escapes_quotes_and_refuses_a_line_break():
    line = environment_line("HERDER_DB", 'postgresql://u:a"b\\c$d@h/db')
    assert line == 'HERDER_DB="postgresql://u:a\\"b\\\\c$d@h/db"'
    assert environment_of(line) == {"HERDER_DB": 'postgresql://u:a"b\\c$d@h/db'}
    with pytest.raises(InputError, match="HERDER_DB: holds a line break"):
        environment_line("HERDER_DB", "a\nb")


def test_the_server_and_the_agent_units_share_one_shape():
    server = unit_values(render(server_unit(["/usr/bin/herder"], "/etc/herder/herder.toml",
                                            ["--listen", "0.0.0.0:8470"], "herder",
                                            "/var/lib/herder", "/etc/herder/server.env")))
    agent = unit_values(render(agent_unit(["/usr/bin/herder"], "https://q:8470", "bms-4",
                                          "herder", "/var/lib/herder",
                                          "/etc/herder/agent-token", 600)))
    for values in (server, agent):
        assert values["User"] == ["herder"] and values["WantedBy"] == ["multi-user.target"]
        assert values["Type"] == ["simple"]
    # A crashed agent is back within the default adopt_grace (10 s), and adopts its jobs.
    assert server["RestartSec"] == ["15"] and agent["RestartSec"] == ["5"]
    assert server["Restart"] == ["on-failure"] and agent["Restart"] == ["always"]
    assert server["EnvironmentFile"] == ["/etc/herder/server.env"]
    assert "EnvironmentFile" not in agent
    assert server["ExecStart"] == [
        "/usr/bin/herder --config /etc/herder/herder.toml server --listen 0.0.0.0:8470"]
    assert agent["TimeoutStopSec"] == ["630"]
    # A restart signals the agent alone: its jobs run on for the next agent to adopt, and
    # `systemctl reload` (SIGHUP) is how an operator says the next stop is a restart.
    assert agent["KillMode"] == ["process"] and "KillMode" not in server
    assert agent["ExecReload"] == ["/bin/kill -HUP $MAINPID"] and "ExecReload" not in server
    for values in (server, agent):
        assert values["NoNewPrivileges"] == ["yes"] and values["PrivateTmp"] == ["yes"]
        assert values["ProtectSystem"] == ["full"] and values["UMask"] == ["0077"]


def test_a_unit_without_optional_lines_leaves_them_out():
    text = render(Unit("d", "u", "/", ["/bin/true"], "no"))
    assert "KillMode" not in text and "TimeoutStopSec" not in text and "#" not in text
    assert text.endswith("WantedBy=multi-user.target\n")


# -- `herder server install-systemd` -------------------------------------------------------------


def install(tmp_path: Path, *args: str, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    return run_herder("server", "install-systemd", "--unit-file",
                      str(tmp_path / "herder-server.service"), "--env-file",
                      str(tmp_path / "etc" / "server.env"), *args, cwd=tmp_path, env=env)


def test_print_writes_nothing_and_never_shows_the_database_url(tmp_path):
    (tmp_path / "herder.toml").write_text("")
    result = install(tmp_path, "--print", "--listen", "0.0.0.0:8470", "--user", "svc",
                     "--allow-plaintext", env={"HERDER_DB": SECRET_URL})
    assert result.returncode == 0, result.stderr
    values = unit_values(result.stdout)
    assert values["User"] == ["svc"] and values["Restart"] == ["on-failure"]
    assert values["EnvironmentFile"] == [str(tmp_path / "etc" / "server.env")]
    argv = exec_argv(values["ExecStart"][0])
    assert argv[-6:] == ["--config", str(tmp_path / "herder.toml"), "server", "--listen",
                         "0.0.0.0:8470", "--allow-plaintext"]
    assert SECRET_URL not in result.stdout + result.stderr and "pa%24s" not in result.stdout
    assert "HERDER_DB=<database URL>" in result.stderr
    assert list(tmp_path.iterdir()) == [tmp_path / "herder.toml"]


@pytest.mark.parametrize(("args", "env", "names"), [
    ((), {}, "--db"),
    (("--listen", "8470"), {"HERDER_DB": SECRET_URL}, "--listen"),
    (("--unit-file", "relative.service"), {"HERDER_DB": SECRET_URL}, "--unit-file"),
    # off loopback without TLS: a unit whose server would refuse to start
    (("--listen", "0.0.0.0:8470"), {"HERDER_DB": SECRET_URL}, "--listen"),
])
def test_what_cannot_make_a_working_unit_is_refused_in_one_line(tmp_path, args, env, names):
    result = install(tmp_path, *args, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"herder: error: {names}: ")
    assert len(result.stderr.splitlines()) == 1 and SECRET_URL not in result.stderr
    assert not (tmp_path / "etc").exists() and not (tmp_path / "herder-server.service").exists()


def test_a_secret_herder_toml_names_must_be_set_to_be_written(tmp_path):
    (tmp_path / "herder.toml").write_text(
        '[hooks.sources.github]\nkind = "github"\nsecret_env = "GH_HOOK_SECRET"\n'
        '[alerts]\nurls_env = "ALERT_URLS"\n')
    missing = install(tmp_path, env={"HERDER_DB": SECRET_URL, "ALERT_URLS": "json://x"})
    assert missing.returncode == 2 and "GH_HOOK_SECRET: is not set here" in missing.stderr
    written = install(tmp_path, env={"HERDER_DB": SECRET_URL, "ALERT_URLS": "json://x",
                                     "GH_HOOK_SECRET": "s3"})
    assert written.returncode == 0, written.stderr
    assert environment_of((tmp_path / "etc" / "server.env").read_text()) == {
        "HERDER_DB": SECRET_URL, "GH_HOOK_SECRET": "s3", "ALERT_URLS": "json://x"}


def test_the_written_unit_starts_a_server_on_the_database_of_its_environment_file(
        tmp_path, sqlite_url):
    (tmp_path / "herder.toml").write_text("")
    port = free_port()
    written = install(tmp_path, "--listen", f"127.0.0.1:{port}", env={"HERDER_DB": sqlite_url})
    assert written.returncode == 0, written.stderr
    assert "systemctl daemon-reload" in written.stderr and sqlite_url not in written.stderr
    unit_file = tmp_path / "herder-server.service"
    environment_file = tmp_path / "etc" / "server.env"
    assert stat.S_IMODE(environment_file.stat().st_mode) == 0o600
    unit = unit_file.read_text()
    assert sqlite_url not in unit
    assert environment_of(environment_file.read_text()) == {"HERDER_DB": sqlite_url}
    values = unit_values(unit)

    # A token only that database knows: the unit's server answers it, so it opened that one.
    secret = new_token()
    with open_store(sqlite_url) as store:
        store.token_insert("ops", Scope.READ, token_hash(secret), datetime.now(UTC))

    # As systemd starts it: ExecStart's argv, WorkingDirectory, the file's variables.
    started = StartedProcesses(tmp_path)
    try:
        server = started.start("server", exec_argv(values["ExecStart"][0]),
                               Path(values["WorkingDirectory"][0]),
                               clean_environment(environment_of(environment_file.read_text())))

        def healthy() -> bool:
            assert server.poll() is None, started.stderr_of(server)
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, 60, "the unit's server to answer /healthz",
                 lambda: started.stderr_of(server))
        jobs = httpx.get(f"http://127.0.0.1:{port}/api/v1/jobs", timeout=30,
                         headers={"Authorization": f"Bearer {secret}"})
        assert jobs.status_code == 200, jobs.text
    finally:
        started.close()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verifies_the_written_unit(tmp_path, sqlite_url):
    import getpass

    written = install(tmp_path, "--user", getpass.getuser(), env={"HERDER_DB": sqlite_url})
    assert written.returncode == 0, written.stderr
    result = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "herder-server.service")],
                            capture_output=True, text=True, timeout=120, check=False)
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if "herder-server.service" in line]
    assert problems == [], result.stdout + result.stderr


def test_the_agent_unit_names_the_ca_it_was_given(tmp_path):
    ca = tmp_path / "server.crt"
    ca.write_text("not checked here\n")
    result = run_herder("agent", "install-systemd", "--server", "https://coordinator:8470",
                        "--host", "bms-4", "--user", "worker", "--ca", "server.crt",
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    argv = exec_argv(unit_values(result.stdout)["ExecStart"][0])
    assert argv[-2:] == ["--ca", str(ca)]
    assert unit_values(result.stdout)["Restart"] == ["always"]


def test_a_file_that_cannot_be_written_is_one_line(tmp_path):
    (tmp_path / "plain-file").write_text("")
    result = run_herder("server", "install-systemd", "--unit-file",
                        str(tmp_path / "herder-server.service"), "--env-file",
                        str(tmp_path / "plain-file" / "server.env"), cwd=tmp_path,
                        env={"HERDER_DB": SECRET_URL})
    assert result.returncode == 2
    assert result.stderr.startswith("herder: error: --env-file: cannot write ")
    assert len(result.stderr.splitlines()) == 1 and SECRET_URL not in result.stderr
    assert not (tmp_path / "herder-server.service").exists()


def test_the_agent_unit_carries_allow_plaintext_and_refuses_plain_http_without_it(tmp_path):
    refused = run_herder("agent", "install-systemd", "--server", "http://coordinator:8470",
                         "--host", "bms-4", cwd=tmp_path)
    assert refused.returncode == 2 and "--allow-plaintext" in refused.stderr
    allowed = run_herder("agent", "install-systemd", "--server", "http://coordinator:8470",
                         "--host", "bms-4", "--allow-plaintext", cwd=tmp_path)
    assert allowed.returncode == 0, allowed.stderr
    argv = exec_argv(unit_values(allowed.stdout)["ExecStart"][0])
    assert argv[-1] == "--allow-plaintext"
    assert unit_values(allowed.stdout)["NoNewPrivileges"] == ["yes"]


# -- herder heartbeat install-systemd (ssh push hosts) ------------------------------------------


def install_heartbeat(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_herder("heartbeat", "install-systemd", "--server", "https://coordinator:8470",
                      "--host", "bms-4", "--unit-dir", str(tmp_path / "units"), *args,
                      cwd=tmp_path)


def test_the_heartbeat_service_runs_heartbeat_once_reading_the_token_file(tmp_path):
    (tmp_path / "units").mkdir()
    ca = tmp_path / "server.crt"
    ca.write_text("not checked here\n")
    result = install_heartbeat(tmp_path, "--user", "worker", "--token-file",
                               "/etc/herder/bms-4-token", "--ca", "server.crt")
    assert result.returncode == 0, result.stderr
    service = (tmp_path / "units" / "herder-heartbeat.service").read_text()
    values = unit_values(service)
    argv = exec_argv(values["ExecStart"][0])
    heartbeat = argv.index("heartbeat")
    assert argv[heartbeat:] == ["heartbeat", "--server", "https://coordinator:8470",
                                "--host", "bms-4", "--token-file", "/etc/herder/bms-4-token",
                                "--ca", str(ca)]
    assert values["Type"] == ["oneshot"] and values["User"] == ["worker"]
    assert "Restart" not in values and "WantedBy" not in values  # its timer starts it
    assert values["TimeoutStartSec"] == ["50"] and values["NoNewPrivileges"] == ["yes"]
    assert "--token " not in service and "HERDER_AGENT_TOKEN" not in service
    timer = unit_values((tmp_path / "units" / "herder-heartbeat.timer").read_text())
    assert timer["OnCalendar"] == ["*-*-* *:*:00"]
    assert timer["Unit"] == ["herder-heartbeat.service"]
    assert timer["WantedBy"] == ["timers.target"]
    assert "enable --now herder-heartbeat.timer" in result.stderr


def test_heartbeat_install_print_writes_nothing_and_bad_options_exit_2(tmp_path):
    printed = install_heartbeat(tmp_path, "--print")
    assert printed.returncode == 0, printed.stderr
    assert f"# {tmp_path / 'units' / 'herder-heartbeat.timer'}" in printed.stdout
    assert unit_values(printed.stdout)["Type"] == ["oneshot"]
    assert not (tmp_path / "units").exists()
    relative = install_heartbeat(tmp_path, "--token-file", "agent-token")
    assert relative.returncode == 2
    assert relative.stderr.startswith("herder: error: --token-file: 'agent-token' is not an "
                                      "absolute path")
    plain = run_herder("heartbeat", "install-systemd", "--server", "http://coordinator:8470",
                       "--host", "bms-4", "--print", cwd=tmp_path)
    assert plain.returncode == 2 and "--allow-plaintext" in plain.stderr
    unwritable = install_heartbeat(tmp_path)  # the folder does not exist
    assert unwritable.returncode == 2
    assert unwritable.stderr.startswith("herder: error: --unit-dir: cannot write ")
    missing_host = run_herder("heartbeat", "--server", "https://coordinator:8470", cwd=tmp_path)
    assert missing_host.returncode == 2
    assert missing_host.stderr.startswith("herder: error: --host: is required")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verifies_the_heartbeat_service_and_timer(tmp_path):
    import getpass

    (tmp_path / "units").mkdir()
    written = install_heartbeat(tmp_path, "--user", getpass.getuser())
    assert written.returncode == 0, written.stderr
    paths = [str(tmp_path / "units" / name)
             for name in ("herder-heartbeat.service", "herder-heartbeat.timer")]
    result = subprocess.run(["systemd-analyze", "verify", *paths], capture_output=True,
                            text=True, timeout=120, check=False)
    problems = [line for line in (result.stdout + result.stderr).splitlines()
                if "herder-heartbeat" in line]
    assert problems == [], result.stdout + result.stderr


@pytest.mark.parametrize(("option", "value"), [
    ("--host", "bms-4\nExecStartPre=/bin/touch /tmp/owned"),
    ("--host", "bms 4"),
    ("--user", "herder\nExecStartPre=/bin/true"),
    ("--user", "her der"),
    ("--token-file", "/etc/herder/agent-token\nExecStartPre=/bin/true"),
    ("--server", "https://coordinator:8470/\nExecStartPre=/bin/true"),
])
@pytest.mark.parametrize("command", ["heartbeat", "agent"])
def test_a_value_that_would_add_a_unit_line_is_refused_naming_its_option(
        tmp_path, command: str, option: str, value: str):
    values = {"--server": "https://coordinator:8470", "--host": "bms-4", "--user": "herder",
              "--token-file": "/etc/herder/agent-token", option: value}
    args = [item for pair in values.items() for item in pair]
    result = run_herder(command, "install-systemd", *args,
                        *(["--print"] if command == "heartbeat" else []), cwd=tmp_path)
    assert result.returncode == 2, result.stdout
    assert result.stderr.startswith(f"herder: error: {option}: ")
    assert "ExecStartPre" not in result.stdout
