"""A job cannot reach herder's secrets (issue 23, "What to build" 1).

The hostile job (tests/support/hostile_scan.py) reads every /proc/PID/environ and cmdline it
can, herder's database, its log folders, token and secret files, and reports every
secret-shaped value it found. The test plants distinctive secrets where an operator would
keep them (the database URL with a password, the legacy API token, an operator's admin
token, a webhook secret by variable and by file, alert URLs, an agent's host token) and
asserts the job finds none of them in any process, nor in herder's logs.

herder runs as an unprivileged user here (`nobody`), with no `run_as`: its jobs run as that
same user. What such a job can still read is what that user owns outright, and the test
says so by name: a secret *file* herder's user must read (a webhook's `secret_file`, the
agent's token file) and the database file. `[runtime] run_as` (jobs under another user)
closes that; its tests reuse the scanner and `hostile_report`.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
from support import hostile_scan
from support.cli import run_herder
from support.environment import clean_environment
from support.ports import free_port
from support.processes import StartedProcesses, kill_group
from support.unprivileged import as_user, give, owned_folder, unprivileged_ids
from support.waits import wait_for

from herder.core.errors import InputError
from herder.runtime.hardening import (
    check_secret_file,
    child_environment,
    secret_value,
    tighten,
    withdraw_secrets,
)
from herder.runtime.job_environment import passes
from herder.runtime.workspace import git_environment
from herder.store import open_store

SCANNER = Path(hostile_scan.__file__).resolve()
JOB_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
"""The scanner needs only the standard library; the system Python, as the test's may live
where the unprivileged user cannot reach it (a pyenv under /root)."""
FAST = ('[runtime]\nheartbeat_interval = "0.3s"\nattempt_lease = "3s"\nkill_grace = "1s"\n'
        'poll_interval = "0.2s"\n[fleet]\nscheduler_interval = "0.2s"\n')
HOOKS = ('[hooks.sources.gh]\nkind = "github"\nsecret_env = "GH_HOOK_SECRET"\n'
         '[hooks.sources.gl]\nkind = "gitea"\nsecret_file = "gl.secret"\n'
         '[alerts]\nurls_env = "ALERT_URLS"\n')


def planted(kind: str) -> str:
    """A secret the scanner recognises by its shape (and the test by its digest)."""
    return f"hsec-{kind}-{secrets.token_hex(16)}"


def hostile_report(log: Path) -> dict[str, Any] | None:
    """The scanner's report in an attempt's log, None until it is there."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(hostile_scan.MARKER):
            report: dict[str, Any] = json.loads(line.removeprefix(hostile_scan.MARKER))
            return report
    return None


def findings(report: Mapping[str, Any], planted_secrets: Mapping[str, str]
             ) -> dict[str, set[str]]:
    """Where each planted secret was found, by its name."""
    names = {hostile_scan.digest(value.encode()): name
             for name, value in planted_secrets.items()}
    found: dict[str, set[str]] = {}
    for hit in report["found"]:
        if hit["sha"] in names:
            found.setdefault(names[hit["sha"]], set()).add(hit["where"])
    return found


@dataclass
class Unprivileged:
    """One test's folder, owned by the unprivileged user, and the herder processes it
    started there as that user."""

    folder: Path
    uid: int
    gid: int
    processes: StartedProcesses = field(init=False)

    def __post_init__(self) -> None:
        # herder's stderr is its log too: the scanner reads these files.
        stderr = self.folder / "stderr"
        stderr.mkdir()
        self.processes = StartedProcesses(give(stderr, self.uid, self.gid, 0o755))

    def write(self, name: str, text: str, mode: int = 0o644) -> Path:
        path = self.folder / name
        path.write_text(text)
        return give(path, self.uid, self.gid, mode)

    def herder(self, *args: str) -> list[str]:
        return as_user([sys.executable, "-m", "herder.cli", "--config",
                        str(self.folder / "herder.toml"), *args], self.uid, self.gid)

    def environment(self, extra: Mapping[str, str]) -> dict[str, str]:
        return clean_environment({"HOME": str(self.folder), **extra})

    def run(self, env: Mapping[str, str], *args: str) -> str:
        done = subprocess.run(self.herder(*args), cwd=self.folder, env=dict(env),
                              capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    def start(self, name: str, env: Mapping[str, str], *args: str) -> subprocess.Popen[Any]:
        return self.processes.start(name, self.herder(*args), self.folder, env)

    def decoy(self, control: str) -> subprocess.Popen[Any]:
        """A process of the same user with a secret in its environment, as any dumpable
        process has: the scanner must find it (or it proves nothing)."""
        return self.processes.start("decoy", as_user(["sleep", "600"], self.uid, self.gid),
                                    self.folder, {"PATH": os.environ["PATH"],
                                                  "DECOY_SECRET": control})

    def scan_job(self) -> list[str]:
        """argv of the hostile job: it notes its umask, then scans this folder."""
        return ["/bin/sh", "-c", f'umask > job.umask; exec "{JOB_PYTHON}" -I "{SCANNER}" '
                                 f'"{self.folder}"']

    def describe(self) -> str:
        return "\n".join(self.processes.tails(40))

    def report(self, log: Path) -> dict[str, Any]:
        def detail() -> str:
            logs = sorted(log.parent.glob("*.log")) if log.parent.exists() else []
            return "\n".join([self.describe(), *(f"--- {path} ---\n{path.read_text()}"
                                                 for path in logs)])

        found: dict[str, Any] = wait_for(lambda: hostile_report(log), 60,
                                         f"the hostile job's report in {log}", detail)
        return found

    def stop(self, process: subprocess.Popen[Any]) -> None:
        kill_group(process, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            kill_group(process)


@pytest.fixture
def unprivileged() -> Iterator[Unprivileged]:
    uid, gid = unprivileged_ids()
    with owned_folder(uid, gid) as folder:
        made = Unprivileged(folder, uid, gid)
        try:
            yield made
        finally:
            made.processes.close()


def assert_nothing_of_herder(report: Mapping[str, Any], planted_secrets: Mapping[str, str],
                             control: str, uid: int, allowed_files: Mapping[str, str]) -> None:
    """The job ran as `uid`, could read /proc (its own environment, the decoy's) and found
    none of the planted secrets but those in the files named (secret -> file)."""
    assert report["uid"] == uid
    assert report["own_environ_read"], report
    found = findings(report, {**planted_secrets, "control": control})
    assert any(where.endswith("/environ") for where in found.get("control", ())), report
    for name, places in found.items():
        if name != "control":
            assert places == {allowed_files.get(name)}, (name, places)
    # herder's processes (`python -m herder.cli ...` and the guardians forked from them);
    # the shell that stands in for ssh is not one (its environment has no secret: above).
    herder_processes = [entry for entry in report["readable_environ"]
                        if "herder.cli" in entry["argv"][1:3]]
    assert not herder_processes, herder_processes
    # An agent's job runs under its supervisor, which holds the job's launch (its env) in
    # its memory: not dumpable either. Another job's supervisor may be caught in its first
    # moment, before its first statement turns dumping off: it holds nothing then (an empty
    # environment; the launch comes later, over a socket).
    supervisors = [entry for entry in report["readable_environ"]
                   if any(str(part).endswith("runtime/supervisor.py") for part in entry["argv"])]
    assert report["parent"] not in {entry["pid"] for entry in supervisors}, supervisors
    assert all(entry["environ_bytes"] == 0 for entry in supervisors), supervisors


def test_a_hostile_job_under_up_finds_no_secret(unprivileged: Unprivileged) -> None:
    """`herder up` (SQLite, the dashboard on) run by an ordinary user with secrets in its
    environment: its job finds none of them, and herder's files are private."""
    run = unprivileged
    planted_secrets = {"legacy": planted("legacy"), "admin": planted("admin"),
                       "hookenv": planted("hookenv"), "hookfile": planted("hookfile"),
                       "alerts": planted("alerts")}
    control = planted("control")
    run.write("herder.toml", f'[herder]\nlog_dir = "logs"\n{FAST}{HOOKS}')
    secret_file = run.write("gl.secret", planted_secrets["hookfile"] + "\n", 0o600)
    env = run.environment({
        "HERDER_DB": f"sqlite:///{run.folder}/herder.db",
        "HERDER_API_TOKEN": planted_secrets["legacy"],
        "HERDER_TOKEN": planted_secrets["admin"],
        "GH_HOOK_SECRET": planted_secrets["hookenv"],
        "ALERT_URLS": f"json://127.0.0.1:9/{planted_secrets['alerts']}",
    })
    run.decoy(control)
    label = f"t{secrets.token_hex(4)}"
    job = int(run.run(env, "submit", "--host", label, "--", *run.scan_job()).strip())
    up = run.start("up", env, "up", "--host", label, "--ui", "--ui-listen",
                   f"127.0.0.1:{free_port()}")
    report = run.report(run.folder / "logs" / str(job) / "1.log")
    run.stop(up)
    assert_nothing_of_herder(report, planted_secrets, control, run.uid,
                             {"hookfile": str(secret_file)})
    assert report["counts"]["files"] >= 3  # the database, its log, herder's stderr at least
    # herder's own files are private; what the job writes is not.
    assert stat.S_IMODE((run.folder / "herder.db").stat().st_mode) == 0o600
    assert stat.S_IMODE((run.folder / "logs").stat().st_mode) == 0o700
    assert stat.S_IMODE((run.folder / "logs" / str(job)).stat().st_mode) == 0o700
    assert stat.S_IMODE((run.folder / "logs" / str(job) / "1.log").stat().st_mode) == 0o600
    assert (run.folder / "job.umask").read_text().strip() == "0022"
    assert stat.S_IMODE((run.folder / "job.umask").stat().st_mode) == 0o644


@pytest.mark.postgres
def test_a_hostile_job_under_server_with_a_local_host_and_an_agent_finds_no_secret(
        unprivileged: Unprivileged, postgres_url: str) -> None:
    """`herder server` (PostgreSQL, a password in its URL) serving a local host, an agent
    reading its host token from a file and one given it in HERDER_AGENT_TOKEN: a job on each
    finds no secret in any process nor in the logs (the server's, its copies of the agents',
    the agents'); the token file and the webhook's secret file are the user's own and
    readable, which `run_as` closes."""
    run = unprivileged
    planted_secrets = {"db": planted("db"), "legacy": planted("legacy"),
                       "admin": planted("admin"), "hookenv": planted("hookenv"),
                       "hookfile": planted("hookfile"), "alerts": planted("alerts")}
    control = planted("control")
    parts = urlsplit(postgres_url)
    with_password = urlunsplit(parts._replace(
        netloc=f"{parts.username}:{planted_secrets['db']}@{parts.hostname}:{parts.port}"))
    port = free_port()
    server_url = f"http://127.0.0.1:{port}"
    # ssh push through a stand-in for ssh that runs the remote command here, as this user;
    # the remote herder runs on the system Python (the test's may be out of this user's reach).
    fake_ssh = run.write("fake-ssh", '#!/bin/sh\nfor last; do :; done\nexec /bin/sh -c "$last"\n',
                         0o755)
    remote_logs = run.folder / "remote-logs"
    run.write("remote.toml", f'[herder]\nlog_dir = "{remote_logs}"\n{FAST}')
    site = [path for path in sys.path if path.endswith("site-packages")]
    remote = (f"HERDER_TOKEN_FILE={run.folder / 'ssh-token'} PYTHONPATH="
              f"{':'.join([str(Path(__file__).resolve().parents[1]), *site])} {JOB_PYTHON} "
              f"-m herder.cli --config {run.folder / 'remote.toml'}")
    run.write("herder.toml", f'[herder]\nlog_dir = "server-logs"\n{FAST}'  # [fleet] last
                             f'ssh_command = ["{fake_ssh}"]\nremote_herder = "{remote}"\n'
                             f'{HOOKS}[hosts.lh]\nram_total_gb = 8\ntransport = "local"\n')
    secret_file = run.write("gl.secret", planted_secrets["hookfile"] + "\n", 0o600)
    added = run_herder("host", "add", "ah", "--ram", "8", cwd=run.folder, db=postgres_url,
                       check=True).stdout.strip()
    planted_secrets["agent"] = added
    token_file = run.write("agent-token", added + "\n", 0o600)
    planted_secrets["agent_env"] = run_herder("host", "add", "ae", "--ram", "8",
                                              cwd=run.folder, db=postgres_url,
                                              check=True).stdout.strip()
    planted_secrets["ssh_host"] = run_herder(
        "host", "add", "sh", "--ram", "8", "--transport", "ssh", "--ssh-target", "fake",
        cwd=run.folder, db=postgres_url, check=True).stdout.strip()
    ssh_token = run.write("ssh-token", planted_secrets["ssh_host"] + "\n", 0o600)
    run_herder("heartbeat", "--host", "sh", cwd=run.folder, db=postgres_url, check=True)
    server_env = run.environment({
        "HERDER_DB": with_password,
        "HERDER_API_TOKEN": planted_secrets["legacy"],
        "HERDER_TOKEN": planted_secrets["admin"],
        "GH_HOOK_SECRET": planted_secrets["hookenv"],
        "ALERT_URLS": f"json://127.0.0.1:9/{planted_secrets['alerts']}",
    })
    run.decoy(control)
    server = run.start("server", server_env, "server", "--listen", f"127.0.0.1:{port}")
    wait_for(lambda: healthy(server_url) or server.poll() is not None, 60,
             "the server to answer", run.describe)
    assert server.poll() is None, run.describe()
    agent_logs = run.folder / "agents"
    agent_logs.mkdir()
    give(agent_logs, run.uid, run.gid, 0o700)
    agents = [
        run.start("agent", run.environment({}), "agent", "--server", server_url, "--host",
                  "ah", "--token-file", str(token_file), "--log-dir", str(agent_logs / "ah"),
                  "--no-ram-check"),
        run.start("agent", run.environment({"HERDER_AGENT_TOKEN": planted_secrets["agent_env"]}),
                  "agent", "--server", server_url, "--host", "ae", "--token-file",
                  str(run.folder / "none"), "--log-dir", str(agent_logs / "ae"),
                  "--no-ram-check")]
    jobs = {label: int(run_herder("submit", "--host", label, "--no-check", "--",
                                  *run.scan_job(), cwd=run.folder, db=postgres_url,
                                  check=True).stdout.strip())
            for label in ("lh", "ah", "ae", "sh")}
    reports = [run.report(run.folder / "server-logs" / str(jobs["lh"]) / "1.log"),
               *(run.report(agent_logs / label / str(jobs[label]) / "1.log")
                 for label in ("ah", "ae")),
               run.report(remote_logs / str(jobs["sh"]) / "1.log")]
    # The server's copies of the agents' logs, once their last chunks are in.
    for label in ("ah", "ae"):
        wait_for(lambda label=label: hostile_report(
            run.folder / "server-logs" / str(jobs[label]) / "1.log"), 30,
            f"agent {label}'s log on the server", run.describe)
    for process in (*agents, server):
        run.stop(process)
    allowed = {"hookfile": str(secret_file), "agent": str(token_file),
               "ssh_host": str(ssh_token)}
    for report in reports:
        assert_nothing_of_herder(report, planted_secrets, control, run.uid, allowed)
    for log in ("server-logs", "agents/ah", "agents/ae"):
        assert stat.S_IMODE((run.folder / log).stat().st_mode) == 0o700
    for label in ("lh", "ah", "ae", "sh"):  # the local attempt's log, the copies of the others'
        copy = run.folder / "server-logs" / str(jobs[label]) / "1.log"
        assert stat.S_IMODE(copy.stat().st_mode) == 0o600, label
    for stderr in run.folder.glob("stderr/*"):
        text = stderr.read_text(errors="replace")
        assert not any(value in text for value in planted_secrets.values()), stderr


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


# -- the parts ------------------------------------------------------------------------------


HARDENED = """
import json, os, subprocess, sys
from herder.runtime.hardening import dumpable, harden_process, secret_value, withdraw_secrets
harden_process()
withdraw_secrets(["HERDER_DB", "MY_SECRET"])
child = subprocess.run(["sh", "-c", "echo ${HERDER_DB:-none} ${MY_SECRET:-none} $(umask)"],
                       capture_output=True, text=True).stdout.split()
print(json.dumps({"dumpable": dumpable(), "umask": oct(os.umask(0o077)), "child": child,
                  "kept": [secret_value("HERDER_DB"), secret_value("MY_SECRET")],
                  "pid": os.getpid()}))
sys.stdout.flush()
sys.stdin.read()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_DUMPABLE is Linux's")
def test_a_hardened_process_is_not_readable_and_its_children_inherit_no_secret(
        tmp_path: Path) -> None:
    """Not dumpable (its /proc files are root's, so a process of the same user cannot read
    its environment), umask 0077, the withdrawn variables gone for children but still
    known to the process; its kernel environment block is what dumpable protects."""
    env = clean_environment({"HERDER_DB": "sqlite:///x.db", "MY_SECRET": "s3cret"})
    with subprocess.Popen([sys.executable, "-c", HARDENED], env=env, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None and process.stdin is not None
        seen = json.loads(process.stdout.readline())
        owner = os.stat(f"/proc/{seen['pid']}/environ").st_uid
        process.stdin.close()
    assert seen["dumpable"] is False
    assert seen["umask"] == "0o77"
    assert seen["child"] == ["none", "none", "0077"]
    assert seen["kept"] == ["sqlite:///x.db", "s3cret"]
    assert owner == 0  # root's: only root (CAP_SYS_PTRACE) reads it now


def test_child_environment_drops_herder_variables_and_withdrawn_secrets(monkeypatch) -> None:
    monkeypatch.setenv("HERDER_DB", "postgresql://u:pw@db/herder")
    monkeypatch.setenv("FORGE_SECRET", "forge")
    monkeypatch.setenv("SSH_AUTH_SOCK", "/run/agent.sock")
    monkeypatch.setenv("PGPASSWORD", "pg")
    monkeypatch.setattr("herder.runtime.hardening._withdrawn", {})
    withdraw_secrets(["FORGE_SECRET"])
    assert "FORGE_SECRET" not in os.environ
    assert secret_value("FORGE_SECRET") == "forge"
    child = child_environment({**os.environ, "FORGE_SECRET": "forge"})
    assert child["SSH_AUTH_SOCK"] == "/run/agent.sock"
    assert "HERDER_DB" not in child and "FORGE_SECRET" not in child
    assert "PGPASSWORD" not in child  # libpq's: kept by herder, given to no child
    assert "PGPASSWORD" not in git_environment(os.environ)
    assert not passes("PGPASSWORD", ["PG*"]) and passes("PGHOST", ["PG*"])


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o602])
def test_a_secret_file_open_to_others_is_refused_naming_chmod(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "token"
    path.write_text("hsec-file-0123456789abcdef\n")
    path.chmod(mode)
    with pytest.raises(InputError) as refused:
        check_secret_file(path, "--token-file")
    assert refused.value.field == "--token-file"
    assert f"chmod 600 {path}" in str(refused.value)
    assert "hsec-file" not in str(refused.value)
    path.chmod(0o600)
    check_secret_file(path, "--token-file")


def test_tighten_takes_group_and_others_off_with_a_log_line(tmp_path: Path, caplog) -> None:
    path = tmp_path / "herder.db"
    path.write_text("")
    path.chmod(0o664)
    assert tighten(path, "the database file")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert "was open to group or others (mode 0664): made it 0600" in caplog.text
    assert not tighten(path, "the database file")
    assert not tighten(tmp_path / "missing", "the database file")


def test_a_new_sqlite_database_and_its_wal_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        with open_store(f"sqlite:///{tmp_path / 'herder.db'}") as store:
            store.host_list()
            modes = {path.name: stat.S_IMODE(path.stat().st_mode)
                     for path in tmp_path.glob("herder.db*")}
    finally:
        os.umask(old)
    assert modes["herder.db"] == 0o600
    assert all(mode == 0o600 for mode in modes.values()), modes


def test_up_tightens_an_older_database_and_log_folder_with_a_log_line(tmp_path: Path) -> None:
    """Files an older herder made 0644 / 0755 are made private at start, said in the log."""
    url = f"sqlite:///{tmp_path / 'herder.db'}"
    open_store(url).close()
    (tmp_path / "herder.db").chmod(0o644)
    (tmp_path / "logs").mkdir(mode=0o755)
    (tmp_path / "logs").chmod(0o755)
    (tmp_path / "herder.toml").write_text('[herder]\nlog_dir = "logs"\n')
    done = run_herder("up", "--exit-when-idle", "--host", f"t{secrets.token_hex(4)}",
                      cwd=tmp_path, db=url, config=tmp_path / "herder.toml")
    assert done.returncode == 0, done.stderr
    assert f"the database file {tmp_path / 'herder.db'} was open to group or others" in \
        done.stderr
    assert f"the folder {tmp_path / 'logs'} was open to group or others" in done.stderr
    assert stat.S_IMODE((tmp_path / "herder.db").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "logs").stat().st_mode) == 0o700


def test_secrets_on_the_command_line_are_deprecated_with_a_warning(tmp_path: Path) -> None:
    """--db with a password and --token are in /proc/PID/cmdline for every local process:
    a warning says so (and names the variable to use), never echoing the value."""
    done = run_herder("--db", "postgresql://user:hsec-pw-0123456789abcdef0@127.0.0.1:1/x",
                      "jobs", cwd=tmp_path)
    assert "--db puts the database password in the command line" in done.stderr
    assert "HERDER_DB" in done.stderr and "hsec-pw" not in done.stderr
    quiet = run_herder("jobs", cwd=tmp_path,
                       env={"HERDER_DB": "postgresql://user:pw@127.0.0.1:1/x"})
    assert "command line" not in quiet.stderr
    done = run_herder("heartbeat", "--host", "x", "--server", "http://127.0.0.1:1",
                      "--token", "hdr_secret0123456789abcdefgh", cwd=tmp_path)
    assert "--token puts a secret in the command line" in done.stderr
    assert "hdr_secret" not in done.stderr


def test_the_server_refuses_a_tls_key_open_to_others(tmp_path: Path) -> None:
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    cert.write_text("not read: the key is refused first\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\nhsec-key-0123456789abcdef\n")
    key.chmod(0o640)
    done = run_herder("server", "--listen", f"127.0.0.1:{free_port()}", "--tls-cert",
                      str(cert), "--tls-key", str(key), cwd=tmp_path,
                      db=f"sqlite:///{tmp_path / 'herder.db'}")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"herder: error: --tls-key: {key} is open to group or others (mode 0640) "
        f"(run chmod 600 {key})")
    assert "hsec-key" not in done.stderr


def test_an_account_key_comes_from_the_environment_not_the_command_line(tmp_path: Path) -> None:
    """`account add --env NAME` takes the value from the environment (off the command line);
    `--env NAME=VALUE` with a secret-looking name still works, with a warning; a name not
    set is refused naming it, nothing stored."""
    url = f"sqlite:///{tmp_path / 'herder.db'}"
    run_herder("host", "add", "h1", "--ram", "8", cwd=tmp_path, db=url, check=True)
    key = planted("key")
    done = run_herder("account", "add", "h1", "a1", "--env", "ANTHROPIC_API_KEY",
                      "--env", "CLAUDE_CONFIG_DIR=/home/w/.claude-1", cwd=tmp_path, db=url,
                      env={"ANTHROPIC_API_KEY": key}, check=True)
    assert "warning" not in done.stderr
    with open_store(url) as store:
        assert store.account_env("h1", "a1") == {"ANTHROPIC_API_KEY": key,
                                                 "CLAUDE_CONFIG_DIR": "/home/w/.claude-1"}
    done = run_herder("account", "add", "h1", "a2", "--env", f"OPENAI_API_KEY={key}",
                      cwd=tmp_path, db=url, check=True)
    assert "--env OPENAI_API_KEY=... puts a secret in the command line" in done.stderr
    assert key not in done.stderr + done.stdout
    done = run_herder("account", "add", "h1", "a3", "--env", "UNSET_API_KEY", cwd=tmp_path,
                      db=url)
    assert done.returncode == 2
    assert "--env: UNSET_API_KEY is not set in this environment" in done.stderr
    with open_store(url) as store:
        assert [record.account.name for record in store.account_list("h1")] == ["a1", "a2"]


def test_a_hostile_job_under_a_root_runner_with_run_as_finds_no_secret(tmp_path: Path) -> None:
    """`herder up` run by root with `[runtime] run_as = "nobody"`: the job runs as nobody and
    finds none of the planted secrets, in any process nor in any file, the ones a same-user
    job could read included (the database, the token file, the webhook's secret file, the
    logs): run_as is the boundary for files."""
    uid, gid = unprivileged_ids()
    folder = Path(tempfile.mkdtemp(prefix="herder-hostile-root-", dir="/tmp"))
    try:
        folder.chmod(0o755)  # the job may pass through (its scanner is here), not read 0600s
        scanner = folder / "scan.py"
        scanner.write_text(SCANNER.read_text())
        planted_secrets = {"legacy": planted("legacy"), "admin": planted("admin"),
                           "hookenv": planted("hookenv"), "hookfile": planted("hookfile"),
                           "alerts": planted("alerts"), "agent": planted("agent")}
        control = planted("control")
        (folder / "herder.toml").write_text(
            f'[herder]\nlog_dir = "logs"\n[runtime]\nrun_as = "nobody"\n'
            f'{FAST.removeprefix("[runtime]")}{HOOKS}')
        (folder / "herder.toml").chmod(0o600)
        secret_file = folder / "gl.secret"
        secret_file.write_text(planted_secrets["hookfile"] + "\n")
        secret_file.chmod(0o600)
        token_file = folder / "agent-token"
        token_file.write_text(planted_secrets["agent"] + "\n")
        token_file.chmod(0o600)
        env = clean_environment({
            "HOME": str(folder),
            "HERDER_DB": f"sqlite:///{folder}/herder.db",
            "HERDER_API_TOKEN": planted_secrets["legacy"],
            "HERDER_TOKEN": planted_secrets["admin"],
            "GH_HOOK_SECRET": planted_secrets["hookenv"],
            "ALERT_URLS": f"json://127.0.0.1:9/{planted_secrets['alerts']}",
        })
        herder = [sys.executable, "-m", "herder.cli", "--config", str(folder / "herder.toml")]
        label = f"t{secrets.token_hex(4)}"
        database = folder / "herder.db"
        job_argv = ["/bin/sh", "-c", f'exec "{JOB_PYTHON}" -I "{scanner}" "{database}" '
                    f'"{token_file}" "{secret_file}" "{folder / "logs"}" '
                    f'"{folder / "herder.toml"}"']
        submitted = subprocess.run([*herder, "submit", "--host", label, "--", *job_argv],
                                   cwd=folder, env=env, capture_output=True, text=True,
                                   timeout=60, check=True)
        job = int(submitted.stdout.strip())
        processes = StartedProcesses(tmp_path)
        try:
            processes.start("decoy", as_user(["sleep", "600"], uid, gid), folder,
                            {"PATH": os.environ["PATH"], "DECOY_SECRET": control})
            up = processes.start("up", [*herder, "up", "--host", label, "--ui", "--ui-listen",
                                        f"127.0.0.1:{free_port()}"], folder, env)
            log = folder / "logs" / str(job) / "1.log"
            report: dict[str, Any] = wait_for(
                lambda: hostile_report(log), 60, f"the hostile job's report in {log}",
                lambda: "\n".join(processes.tails(40)))
            kill_group(up, signal.SIGTERM)
            up.wait(timeout=30)
            stderr = processes.stderr_of(up)
        finally:
            processes.close()
        assert not any(value in stderr for value in planted_secrets.values())
        assert_nothing_of_herder(report, planted_secrets, control, uid, {})
        # Every file named was refused: the database, the token file, the secret file,
        # herder.toml (the log folder is 0700, so its files are not even listed).
        assert report["counts"]["files"] == 0, report
        assert report["counts"]["files_refused"] >= 4, report
        assert stat.S_IMODE((folder / "logs").stat().st_mode) == 0o700
        assert stat.S_IMODE(database.stat().st_mode) == 0o600
    finally:
        shutil.rmtree(folder, ignore_errors=True)
