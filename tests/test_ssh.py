"""SSH push against a real sshd on 127.0.0.1, started by the test."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.cli import herder_argv, run_herder
from support.ports import free_port
from support.processes import process_argv, process_ids, process_parent
from support.waits import wait_for

from herder.core.model import JobStatus, Outcome, launch_errors
from herder.core.settings.sections import Settings
from herder.store import open_store

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
pytestmark = pytest.mark.skipif(
    not os.path.exists(SSHD) and not os.environ.get("CI"),
    reason="sshd is not installed (apt-get install openssh-server)",
)


@dataclass
class Sshd:
    config: Path
    alias: str
    dead_alias: str


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    folder = tmp_path / "ssh"
    folder.mkdir(mode=0o700)
    Path("/run/sshd").mkdir(exist_ok=True)
    for name in ("hostkey", "userkey"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                        str(folder / name)], check=True)
    (folder / "authorized_keys").write_text((folder / "userkey.pub").read_text())
    (folder / "authorized_keys").chmod(0o600)
    port, dead_port = free_port(), free_port()
    (folder / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {folder / 'hostkey'}\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
        f"StrictModes no\nUsePAM no\nPidFile {folder / 'sshd.pid'}\n")
    client = folder / "ssh_config"
    common = (f"  HostName 127.0.0.1\n  User {os.environ.get('USER', 'root')}\n"
              f"  IdentityFile {folder / 'userkey'}\n  StrictHostKeyChecking no\n"
              "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  ConnectTimeout 3\n")
    client.write_text(f"Host herder-test\n  Port {port}\n{common}"
                      f"Host herder-dead\n  Port {dead_port}\n{common}")
    process = subprocess.Popen([SSHD, "-D", "-f", str(folder / "sshd_config"), "-E",
                                str(folder / "sshd.log")])
    try:
        wait_for(lambda: subprocess.run(
            ["ssh", "-F", str(client), "-o", "BatchMode=yes", "herder-test", "true"],
            check=False, capture_output=True).returncode == 0, 15, "sshd to accept a login")
        yield Sshd(client, "herder-test", "herder-dead")
    finally:
        process.terminate()
        process.wait(10)


def herder(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`herder ARGS...` with the test's herder.toml; it must exit 0."""
    return run_herder(*args, cwd=tmp, config=tmp / "herder.toml", check=True)


@pytest.fixture
def fleet(tmp_path: Path, sshd: Sshd, store_url: str) -> Iterator[tuple[Path, str]]:
    remote_config = tmp_path / "remote.toml"
    remote_config.write_text(f'[herder]\nlog_dir = "{tmp_path / "remote-logs"}"\n'
                             '[runtime]\nheartbeat_interval = "0.3s"\n')
    remote = (f"HERDER_TOKEN_FILE={tmp_path / 'token'} {sys.executable} -m herder.cli "
              f"--config {remote_config}")
    (tmp_path / "herder.toml").write_text(
        f'[herder]\ndb = "{store_url}"\nlog_dir = "{tmp_path / "logs"}"\n'
        '[runtime]\nheartbeat_interval = "0.3s"\nattempt_lease = "3s"\nkill_grace = "1s"\n'
        '[defaults]\nbackoff_base = "0s"\n'
        f'[fleet]\nscheduler_interval = "0.2s"\nspawn_backoff = "0s"\nmax_spawn_failures = 2\n'
        f'ssh_command = ["ssh", "-F", "{sshd.config}"]\nremote_herder = "{remote}"\n')
    yield tmp_path, store_url


@contextmanager
def running_server(tmp: Path) -> Iterator[None]:
    with open(tmp / "server.log", "wb") as log:
        process = subprocess.Popen(
            herder_argv("server", "--listen", f"127.0.0.1:{free_port()}",
                        config=tmp / "herder.toml"), cwd=tmp,
            stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    try:
        # Serving before the test goes on: the hosts a test adds then come after the start,
        # as for an operator who adds an ssh host to a running server.
        wait_for(lambda: "listening on" in (tmp / "server.log").read_text(), 60,
                 "the server to listen", (tmp / "server.log").read_text)
        yield
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(20)


@pytest.fixture
def server(fleet: tuple[Path, str]) -> Iterator[tuple[Path, str]]:
    with running_server(fleet[0]):
        yield fleet


def add_ssh_host(tmp: Path, label: str, target: str) -> str:
    token = herder(tmp, "host", "add", label, "--ram", "16", "--transport", "ssh",
                   "--ssh-target", target, "--prime-workers", "2",
                   "--night-workers", "2").stdout.strip()
    herder(tmp, "heartbeat", "--host", label)
    return token


def test_ssh_push_runs_the_attempt_remotely_and_reports_over_the_api(
    tmp_path: Path, sshd: Sshd, fleet: tuple[Path, str]
) -> None:
    tmp, url = fleet
    token = add_ssh_host(tmp, "s1", sshd.alias)
    (tmp / "token").write_text(token)
    (tmp / "token").chmod(0o600)  # run-attempt refuses a token file others may read
    job_id = int(herder(tmp, "submit", "--", "sh", "-c",
                        'echo "ran on $HERDER_HOST as attempt $HERDER_ATTEMPT"').stdout)
    store = open_store(url)
    with running_server(tmp):
        job = wait_for(lambda: (j := store.job_get(job_id)) and j.status.terminal and j, 60,
                    "the ssh job to end")
        assert job.status is JobStatus.DONE, (tmp / "server.log").read_text()
        assert job.host == "s1"
        attempts = store.attempt_list(job_id)
        assert [a.outcome for a in attempts] == ["ok"]
        # The log was written remotely and shipped to the server's log folder.
        log = Path(attempts[0].log_path or "").read_text()
        assert "ran on s1 as attempt 1" in log
        assert (tmp / "remote-logs" / str(job_id) / "1.log").exists()
    store.close()


def test_an_ssh_job_runs_under_an_account_of_its_host(
    tmp_path: Path, sshd: Sshd, fleet: tuple[Path, str]
) -> None:
    """A job type that asks for an account gets one of the ssh host's, bound by the server
    when it launches the attempt (its session counted), and its env on the remote side."""
    tmp, url = fleet
    with open(tmp / "herder.toml", "a") as config:
        config.write('[job_types.agent]\ncommand = ["sh", "-c", "echo who=$WHO"]\n'
                     "accounts = true\npreflight = false\n")
    token = add_ssh_host(tmp, "s1", sshd.alias)
    (tmp / "token").write_text(token)
    (tmp / "token").chmod(0o600)
    herder(tmp, "account", "add", "s1", "alpha", "--env", "WHO=alpha-account")
    job_id = int(herder(tmp, "submit", "agent").stdout)
    store = open_store(url)
    with running_server(tmp):
        job = wait_for(lambda: (j := store.job_get(job_id)) and j.status.terminal and j, 60,
                       "the ssh job to end")
        assert job.status is JobStatus.DONE, (tmp / "server.log").read_text()
        [attempt] = store.attempt_list(job_id)
        assert "who=alpha-account" in Path(attempt.log_path or "").read_text()
        assert [e.detail["account"] for e in store.event_list(job_id)
                if e.kind == "account"] == ["alpha"]
        assert "alpha-account" not in (tmp / "server.log").read_text()
    store.close()


def test_unreachable_ssh_host_is_a_spawn_failure_with_backoff_then_fails(
    tmp_path: Path, sshd: Sshd, server: tuple[Path, str]
) -> None:
    tmp, url = server
    add_ssh_host(tmp, "dead", sshd.dead_alias)
    job_id = int(herder(tmp, "submit", "--", "true").stdout)
    store = open_store(url)
    try:
        # A bound, not a pace: under heavy load each ssh round trip may be lost to the 3 s
        # lease a few times (nothing spent) before two attempts run and fail.
        job = wait_for(lambda: (j := store.job_get(job_id)) and j.status.terminal and j, 180,
                    "the job to fail", lambda: (store.job_get(job_id), store.event_list(job_id),
                                                (tmp / "server.log").read_text()[-4000:]))
        assert job.status is JobStatus.FAILED
        assert job.failure_reason == "spawn_ssh_failure"  # exit 255: unreachable
        assert job.spawn_failures == 2  # max_spawn_failures
        assert job.failures == 0  # host trouble never spends the job's own attempts
        attempts = store.attempt_list(job_id)
        assert [a.exit_code for a in attempts] == [255, 255]
        assert all(a.started_at is None for a in attempts)
        # what ssh said is kept on each attempt, and `why` repeats the last
        errors = launch_errors(store.event_list(job_id))
        assert sorted(errors) == [1, 2] and all(
            text.startswith("ssh exited 255: ") for text in errors.values()), errors
        why = herder(tmp, "why", str(job_id)).stdout
        assert f"its last attempt on dead could not start: {errors[2]}" in why, why
    finally:
        store.close()


def test_remote_side_without_a_token_exits_1_and_the_job_is_retried_then_failed(
    tmp_path: Path, sshd: Sshd, server: tuple[Path, str]
) -> None:
    tmp, url = server
    add_ssh_host(tmp, "s2", sshd.alias)  # no token file on the "remote" side
    job_id = int(herder(tmp, "submit", "--max-attempts", "2", "--", "true").stdout)
    store = open_store(url)
    try:
        # A bound, not a pace: under heavy load each ssh round trip may be lost to the 3 s
        # lease a few times (nothing spent) before two attempts run and fail.
        job = wait_for(lambda: (j := store.job_get(job_id)) and j.status.terminal and j, 180,
                    "the job to fail", lambda: (store.job_get(job_id), store.event_list(job_id),
                                                (tmp / "server.log").read_text()[-4000:]))
        assert job.status is JobStatus.FAILED
        attempts = store.attempt_list(job_id)
        assert job.failure_reason == "launch_failed", attempts
        # Two attempts ran and failed; on a loaded machine one may also be lost before its
        # run-attempt reported (declared lost, nothing spent), which is no failure.
        ran = [a for a in attempts if a.outcome is not Outcome.LOST]
        assert [a.exit_code for a in ran] == [1, 1], attempts
        errors = launch_errors(store.event_list(job_id))
        for attempt in ran:  # the remote herder's one-line error, through ssh
            assert errors[attempt.attempt].startswith("ssh exited 1: herder: error: "), errors
    finally:
        store.close()


def run_attempt_processes(config: Path, job_id: int) -> list[int]:
    """Pids of `herder run-attempt --job <job_id>` (the ssh session's remote side), not of
    its guardian (a fork: the same command line, run-attempt its parent)."""
    found = []
    for pid in process_ids():
        argv = process_argv(pid)
        if str(config) in argv and "run-attempt" in argv and (
                str(job_id) in argv[argv.index("run-attempt"):]):
            found.append(pid)
    return [pid for pid in found if process_parent(pid) not in found]


def test_a_frozen_run_attempt_s_job_is_stopped_by_its_guardian_before_the_rerun(
    tmp_path: Path, sshd: Sshd, fleet: tuple[Path, str]
) -> None:
    """The remote `herder run-attempt` freezes (SIGSTOP) while its job runs: it can neither
    heartbeat nor fence itself. Its guardian kills the job at its backstop, before the server
    declares the attempt lost and pushes the next one; the guardian does not hold the ssh
    session open once run-attempt is gone."""
    from herder.runtime.process import token_markers

    tmp, url = fleet
    token = add_ssh_host(tmp, "s3", sshd.alias)
    (tmp / "token").write_text(token)
    (tmp / "token").chmod(0o600)
    # Each attempt holds the job's lock for its whole life; a second one that finds it held
    # ran while the first still did.
    job_id = int(herder(tmp, "submit", "--", "sh", "-c",
                        f'exec 9>>{tmp / "job.lock"}; flock -n 9 || {{ echo overlap >> '
                        f'{tmp / "overlap"}; exit 1; }}; '
                        'if [ "$HERDER_ATTEMPT" = 1 ]; then exec sleep 300; fi; echo second'
                        ).stdout)
    first = f"{job_id}.1@"
    store = open_store(url)
    with running_server(tmp):
        wait_for(lambda: any(m.startswith(first) for m in token_markers()), 60,
              "attempt 1 to run over ssh")
        [remote] = wait_for(lambda: run_attempt_processes(tmp / "remote.toml", job_id), 10,
                         "run-attempt's pid")
        os.kill(remote, signal.SIGSTOP)
        try:
            wait_for(lambda: not any(m.startswith(first) for m in token_markers()), 30,
                  "the guardian to stop the frozen run-attempt's job")
            job = wait_for(lambda: (j := store.job_get(job_id)) and j.status.terminal and j,
                           180, "the rerun")
        finally:
            os.kill(remote, signal.SIGCONT)
        assert not (tmp / "overlap").exists(), "attempt 2 ran while attempt 1 still did"
        # Attempt 2 is the rerun; on a loaded machine a rerun may itself be lost (its
        # run-attempt slow to start) and a third one finish the job. Overlap is what fails.
        assert job.status is JobStatus.DONE and job.attempt >= 2, job
        assert all(a.outcome is Outcome.LOST for a in store.attempt_list(job_id)[1:-1]), (
            store.attempt_list(job_id))
        assert [a.outcome for a in store.attempt_list(job_id)] == ["lost", "ok"]
        wait_for(lambda: remote not in run_attempt_processes(tmp / "remote.toml", job_id), 30,
              "the thawed run-attempt to exit")
    store.close()


def test_an_ssh_client_that_cannot_start_is_a_spawn_failure_with_its_os_error(
    tmp_path: Path, fleet: tuple[Path, str]
) -> None:
    tmp, url = fleet
    config = tmp / "herder.toml"
    missing = tmp / "no-ssh-here"
    config.write_text(config.read_text().replace('ssh_command = ["ssh",',
                                                 f'ssh_command = ["{missing}",'))
    add_ssh_host(tmp, "s3", "nowhere")
    job_id = int(herder(tmp, "submit", "--", "true").stdout)
    store = open_store(url)
    try:
        with running_server(tmp):
            job = wait_for(lambda: (j := store.job_get(job_id)) and j.status.terminal and j,
                           60, "the job to fail")
        assert (job.status, job.failure_reason, job.failures) == (
            JobStatus.FAILED, "spawn_failed", 0), job
        error = f"spawn failed: [Errno 2] No such file or directory: '{missing}'"
        assert launch_errors(store.event_list(job_id)) == {1: error, 2: error}
        assert herder(tmp, "why", str(job_id)).stdout.endswith(
            f"its last attempt on s3 could not start: {error}\n")
    finally:
        store.close()


def test_the_launcher_looks_for_placements_only_when_asked(tmp_path: Path, store) -> None:
    """Its frequent cycle only settles ssh processes; the store is scanned for placements
    when a placement wakes it, or now and then (`scan`)."""
    from herder.core.model import AttemptToken, HostRecord, JobSpec, Transport
    from herder.runtime.endings import PolicyLimits
    from herder.runtime.ssh import SshLauncher

    now = datetime.now(UTC)
    store.host_insert(HostRecord("s4", 16, transport=Transport.SSH, ssh_target="nowhere"), now)
    [inserted] = store.job_insert([JobSpec(command=("true",))], now)
    store.job_assign("s4", [(inserted.job_id, 3.0)], 1, 12.8, now)
    launcher = SshLauncher(store, "http://127.0.0.1:1", ["true"], "herder",
                           PolicyLimits.from_settings(Settings()), tmp_path, "server/1/1")
    try:
        assert launcher.run_once(scan=False) == {"launched": 0, "ended": 0}
        [live] = store.attempt_list_live("s4")
        assert live.attempt.worker == ""
        assert launcher.run_once(scan=True)["launched"] == 1
        [live] = store.attempt_list_live("s4")
        assert (live.attempt.token, live.attempt.worker) == (
            AttemptToken(inserted.job_id, 1), "server/1/1")
    finally:
        launcher.stop()


def test_an_attempt_whose_account_was_removed_is_not_handed_out(tmp_path: Path, store) -> None:
    """The launcher bound an account; it is removed before `run-attempt` fetches the
    attempt: the attempt is refused (tried again soon, nothing spent), never run without the
    account's credentials."""
    from herder.core.model import Account, AttemptToken, HostRecord, JobSpec, Transport
    from herder.core.settings.loading import Config
    from herder.core.settings.sections import Settings
    from herder.runtime.coordinator import Coordinator

    now = datetime.now(UTC)
    store.host_insert(HostRecord("s5", 16, transport=Transport.SSH, ssh_target="x"), now)
    store.account_upsert(Account("s5", "alpha", {"WHO": "alpha"}), now)
    [inserted] = store.job_insert([JobSpec(command=("true",))], now)
    store.job_assign("s5", [(inserted.job_id, 3.0)], 1, 12.8, now)
    token = AttemptToken(inserted.job_id, 1)
    assert store.attempt_set_worker(token, "server/1/1", now)
    assert store.attempt_bind_account(token, "s5", "alpha", 1, now)
    coordinator = Coordinator(store, Config(Settings(), None), host="server")
    handed = coordinator.agents.placed_attempt("s5", token)
    assert handed is not None and handed.env["WHO"] == "alpha"
    assert store.account_delete("s5", "alpha")
    assert coordinator.agents.placed_attempt("s5", token) is None
    job = store.job_get(inserted.job_id)  # refused: back in the queue, nothing spent
    assert job is not None and (job.status, job.failures, job.lost, job.spawn_failures) == (
        JobStatus.QUEUED, 0, 0, 0)
    assert [a.outcome for a in store.attempt_list(inserted.job_id)] == ["refused"]
    assert launch_errors(store.event_list(inserted.job_id)) == {
        1: "account alpha on s5 was removed before the attempt started"}


def test_preflight_runs_on_the_ssh_host_through_ssh_and_holds_the_job_until_it_passes(
    tmp_path: Path, sshd: Sshd, fleet: tuple[Path, str]
) -> None:
    """The server runs the job type's preflight on the ssh host (`herder preflight` through
    the same ssh, with the host's own herder.toml): while it fails the job stays queued with
    nothing spent and `why` says so, a push heartbeat keeps the verdict, and once it passes
    the job runs there."""
    tmp, url = fleet
    tool = tmp / "remote-bin" / "agentcli"
    record = tmp / "preflight.record"
    check = tmp / "check.sh"
    check.write_text(f'#!/bin/sh\necho "ssh=${{SSH_CONNECTION:-none}}" >> {record}\n'
                     f'test -x {tool} || {{ echo "no agentcli here" >&2; exit 1; }}\n')
    check.chmod(0o755)
    with open(tmp / "remote.toml", "a") as remote:  # its [runtime] is the last table
        remote.write('pass_env = ["SSH_CONNECTION"]\n')
    with open(tmp / "herder.toml", "a") as config:
        config.write(f'[job_types.agentic]\ncommand = ["{tool}", "work"]\n'
                     f'preflight = ["{check}"]\npreflight_cache = "1s"\n')
    token = add_ssh_host(tmp, "s1", sshd.alias)
    (tmp / "token").write_text(token)
    (tmp / "token").chmod(0o600)
    job_id = int(herder(tmp, "submit", "agentic", "--no-check").stdout)
    store = open_store(url)

    def failed_there() -> dict[str, str]:
        host = store.host_get("s1")
        found = (host.agent_info if host is not None else {}).get("preflight_failed")
        return found if isinstance(found, dict) else {}

    try:
        with running_server(tmp):
            wait_for(lambda: "agentic" in failed_there(), 60, "s1's failed preflight",
                     lambda: (tmp / "server.log").read_text()[-4000:])
            assert "no agentcli here" in failed_there()["agentic"]
            why = wait_for(lambda: "s1 preflight failed" in (text := herder(
                tmp, "why", str(job_id)).stdout) and text, 30, "why to name the preflight")
            assert "no agentcli here" in why, why
            job = store.job_get(job_id)
            assert job is not None and job.status is JobStatus.QUEUED
            # Never run there: at most refused, if placed before the first verdict came in
            # (nothing spent), and not placed there again.
            assert [a.outcome for a in store.attempt_list(job_id)] in ([], [Outcome.REFUSED])
            assert (job.failures, job.spawn_failures) == (0, 0)
            # it ran on the host, through ssh, with the host's own settings
            assert record.read_text().startswith("ssh=127.0.0.1 "), record.read_text()
            herder(tmp, "heartbeat", "--host", "s1")  # a push heartbeat keeps the verdict
            assert "agentic" in failed_there()

            tool.parent.mkdir()
            tool.write_text('#!/bin/sh\necho "agentcli ran on $HERDER_HOST"\n')
            tool.chmod(0o755)
            job = wait_for(lambda: (j := store.job_get(job_id)) and j.status.terminal and j,
                           90, "the job to run once the preflight passes",
                           lambda: (tmp / "server.log").read_text()[-4000:])
            assert (job.status, job.host, job.failures) == (JobStatus.DONE, "s1", 0)
            attempt = store.attempt_list(job_id)[-1]
            assert "agentcli ran on s1" in Path(attempt.log_path or "").read_text()
            assert failed_there() == {}
    finally:
        store.close()


FAKE_SSH = """\
import json, sys
if not sys.argv[-1].endswith(" preflight"):
    sys.exit(0)  # a launch: nothing to do here
checks = json.load(sys.stdin)
print("Warning: Permanently added 'host' to the list of known hosts.", file=sys.stderr)
if open(sys.argv[0] + ".mode").read() == "old":
    print("Error: No such command 'preflight'.", file=sys.stderr)
    sys.exit(2)
print(json.dumps({job_type: {"ok": False, "detail": "agentcli: not found"}
                  for job_type in checks}))
"""


@pytest.mark.parametrize("remote", ["answers", "old"])
def test_the_launchers_preflight_round_records_verdicts_or_fails_open(
        tmp_path: Path, store, remote: str) -> None:
    """Verdicts on stdout count (ssh's warnings on stderr do not mix in); a remote herder
    that cannot answer decides nothing, and the placement is launched as before."""
    from herder.core.model import HostRecord, JobSpec, Transport
    from herder.runtime.endings import PolicyLimits
    from herder.runtime.preflight import Check
    from herder.runtime.ssh import SshLauncher

    fake = tmp_path / "fake-ssh"
    fake.write_text(f"#!{sys.executable}\n{FAKE_SSH}")
    fake.chmod(0o755)
    (tmp_path / "fake-ssh.mode").write_text(remote)
    now = datetime.now(UTC)
    store.host_insert(HostRecord("s6", 16, transport=Transport.SSH, ssh_target="x"), now)
    [inserted] = store.job_insert([JobSpec(job_type="agentic", command=("agentcli",))], now)
    store.job_assign("s6", [(inserted.job_id, 3.0)], 1, 12.8, now)
    launcher = SshLauncher(store, "http://127.0.0.1:1", [str(fake)], "herder",
                           PolicyLimits.from_settings(Settings()), tmp_path, "server/1/1",
                           preflight={"agentic": Check(("agentcli", "--version"))})
    try:
        assert launcher.run_once(scan=True)["launched"] == 0  # its verdict is to come
        wait_for(lambda: launcher.run_once(scan=False) is not None
                 and launcher.hosts["s6"].round is None, 30, "the preflight round to end")
        host = store.host_get("s6")
        assert host is not None
        launched = launcher.run_once(scan=True)["launched"]
        if remote == "old":
            assert launched == 1  # fail-open
            assert "preflight_failed" not in host.agent_info
            return
        assert host.agent_info["preflight_failed"] == {"agentic": "agentcli: not found"}
        assert launched == 0
        assert [a.outcome for a in store.attempt_list(inserted.job_id)] == ["refused"]
        job = store.job_get(inserted.job_id)
        assert job is not None and (job.status, job.failures, job.spawn_failures) == (
            JobStatus.QUEUED, 0, 0)
    finally:
        launcher.stop()
