"""`[runtime] run_as`: a root runner's jobs run as an unprivileged user.

The checks at start are pure (the user database is real, the runner's uid is passed in).
The end-to-end tests run `herder up` as root with `run_as = "nobody"` (uid 65534) and real
jobs: what the job is, what it may write (its $HERDER_RESULT, its checkout), what it may
not read (the database, the logs, a token file, herder's environment, another attempt's
result), and that cancel, the cgroup and the sweep still reach it. They skip when the
tests do not run as root (CI runs them as root).
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli import error_line, run_herder
from support.local import Harness, shell
from support.processes import Proc
from support.waits import wait_for

from herder.core.errors import InputError
from herder.core.model import Enforcement, JobStatus, Outcome
from herder.runtime import workspace
from herder.runtime.attempt_files import RESULT_NAME, collect_result
from herder.runtime.cgroup import detect
from herder.runtime.job_environment import job_environment
from herder.runtime.job_user import JobUser, foreign_folders, passable, resolve

NOBODY = 65534


def nobody() -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


as_root = pytest.mark.skipif(
    os.geteuid() != 0 or nobody() is None or nobody().pw_uid != NOBODY,  # type: ignore[union-attr]
    reason="switching jobs to another user needs root and the user nobody (uid 65534)")


# -- the checks at start --------------------------------------------------------------------------


def test_an_unknown_user_is_refused_naming_the_key_and_the_fix():
    with pytest.raises(InputError) as raised:
        resolve("no-such-herder-user", 0)
    assert raised.value.field == "[runtime] run_as"
    assert "no user 'no-such-herder-user'" in raised.value.problem
    assert raised.value.fix is not None and "useradd --system" in raised.value.fix


def test_root_is_refused_even_when_herder_is_root():
    with pytest.raises(InputError) as raised:
        resolve("root", 0)
    assert "is root" in raised.value.problem


def test_another_user_needs_a_root_runner_and_its_own_user_is_a_no_op():
    entry = nobody()
    if entry is None:
        pytest.skip("no user nobody here")
    with pytest.raises(InputError) as raised:
        resolve(entry.pw_name, 1000)
    assert "needs herder to run as root (it runs as uid 1000)" in raised.value.problem
    assert resolve(entry.pw_name, entry.pw_uid) is None
    assert resolve(None, 0) is None


def test_a_root_runner_switches_to_the_user_with_its_groups_and_identity():
    entry = nobody()
    if entry is None:
        pytest.skip("no user nobody here")
    user = resolve(entry.pw_name, 0)
    assert user is not None
    assert (user.uid, user.gid, user.home) == (entry.pw_uid, entry.pw_gid, entry.pw_dir)
    assert entry.pw_gid in user.groups
    assert user.environment()["USER"] == user.environment()["LOGNAME"] == entry.pw_name


def test_a_folder_shut_to_the_user_on_the_way_to_the_workspace_root_is_named(open_root):
    user = JobUser(name="j", uid=123456, gid=123456, groups=(123456,), home="/", shell="")
    shut = open_root.parent / "state"
    (shut / "ws").mkdir(parents=True)
    shut.chmod(0o700)
    assert passable(user, shut / "ws" / "root") == shut
    shut.chmod(0o711)
    assert passable(user, shut / "ws" / "root") is None
    assert passable(user, shut / "missing" / "root") is None  # herder makes the rest
    (shut / "ws").chmod(0o750)
    assert passable(user, shut / "ws" / "root") == shut / "ws"
    assert passable(JobUser(name="j", uid=123456, gid=os.stat(shut).st_gid, groups=(),
                            home="/", shell=""), shut / "ws" / "root") is None  # its group


def test_folders_a_job_s_env_names_that_the_user_does_not_own_are_named(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    user = JobUser(name="j", uid=os.getuid(), gid=os.getgid(), groups=(), home="/", shell="")
    stranger = JobUser(name="s", uid=123456, gid=123456, groups=(), home="/", shell="")
    env = {"CLAUDE_CONFIG_DIR": str(mine), "CODEX_HOME": str(tmp_path / "missing"),
           "XDG_CONFIG_HOME": "relative", "EDITOR_PATH": str(mine), "HOME": str(tmp_path)}
    assert foreign_folders(user, env) == []
    assert foreign_folders(stranger, env) == ["CLAUDE_CONFIG_DIR", "HOME"]


def test_the_job_gets_the_user_s_identity_unless_its_own_env_sets_home():
    from test_job_environment import a_job

    user = JobUser(name="j", uid=5, gid=5, groups=(5,), home="/home/j", shell="/bin/bash")
    runner = {"PATH": "/bin", "HOME": "/root", "USER": "root", "SHELL": "/bin/zsh"}
    result = Path("/ws/runs/7.2-x/result.json")
    env = job_environment(a_job(), "h", "m", Path("/logs/7/2.log"), runner_environment=runner,
                          user=user, result_path=result)
    assert {name: env[name] for name in ("HOME", "USER", "LOGNAME", "SHELL", "PATH")} == {
        "HOME": "/home/j", "USER": "j", "LOGNAME": "j", "SHELL": "/bin/bash", "PATH": "/bin"}
    assert env["HERDER_RESULT"] == str(result)
    account = job_environment(a_job({"HOME": "/srv/acct", "USER": "x"}), "h", "m",
                              Path("/l"), runner_environment=runner, user=user)
    assert (account["HOME"], account["USER"]) == ("/srv/acct", "x")
    assert account["HERDER_RESULT"] == "/l.result.json"  # no folder given: beside the log


@pytest.mark.parametrize("planted", ["link", "pipe", "hard link", "plain"])
def test_a_result_is_collected_only_from_a_plain_file_of_its_own(tmp_path, planted):
    """The job owns the folder: a link to a secret, a pipe that would block herder, or a
    hard link to a file elsewhere is not copied beside the log."""
    secret = tmp_path / "secret"
    secret.write_text('{"summary": "root only"}')
    folder = tmp_path / "runs" / "7.2-x"
    folder.mkdir(parents=True)
    (folder.parent / "7.2-x.owner").write_text("w\n")
    result = folder / RESULT_NAME
    if planted == "link":
        result.symlink_to(secret)
    elif planted == "pipe":
        os.mkfifo(result)
    elif planted == "hard link":
        os.link(secret, result)
    else:
        result.write_text('{"summary": "mine"}')
    log = tmp_path / "logs" / "7" / "2.log"
    log.parent.mkdir(parents=True)
    note = collect_result(folder, log)
    copied = log.with_suffix(".result.json")
    if planted == "plain":
        assert note is None and copied.read_text() == '{"summary": "mine"}'
    else:
        assert note is not None and note.startswith("$HERDER_RESULT ignored: "), note
        assert not copied.exists()
    assert not folder.exists() and not (folder.parent / "7.2-x.owner").exists()
    assert collect_result(folder, log) is None  # none written: nothing to say


@pytest.mark.parametrize("planted", ["link", "dangling link", "plain"])
def test_the_preparing_process_writes_its_result_only_into_a_new_file(tmp_path, planted):
    """Before it becomes the run_as user, the preparing process is root writing into the
    user's folder: a link planted there (by another job of that user, who can work out
    the folder's name) is never followed, nor a file there overwritten."""
    target = tmp_path / "shadow"
    target.write_text("root:x:0\n")
    result = tmp_path / "runs" / "7.2-x" / RESULT_NAME
    result.parent.mkdir(parents=True)
    if planted == "link":
        result.symlink_to(target)
    elif planted == "dangling link":
        result.symlink_to(tmp_path / "created-by-root")
    else:
        result.write_text("{}")
    workspace._result({"HERDER_RESULT": str(result)}, {"outcome": "workspace_failed"})
    assert target.read_text() == "root:x:0\n"
    assert not (tmp_path / "created-by-root").exists()
    if planted == "plain":
        assert result.read_text() == "{}"
    fresh = result.with_name("fresh.json")
    workspace._result({"HERDER_RESULT": str(fresh)}, {"outcome": "workspace_failed"})
    assert json.loads(fresh.read_text()) == {"outcome": "workspace_failed"}


@pytest.mark.parametrize("command", [
    ["agent", "--server", "https://127.0.0.1:1", "--host", "h"],
    ["run-attempt", "--server", "https://127.0.0.1:1", "--host", "h", "--job", "1",
     "--attempt", "1"],
    ["server", "--listen", "127.0.0.1:1"],
    ["up"],
], ids=lambda command: command[0])
def test_every_process_that_runs_jobs_refuses_an_unknown_run_as_at_start(
        tmp_path, sqlite_url, command):
    config = tmp_path / "herder.toml"
    config.write_text('[runtime]\nrun_as = "no-such-herder-user"\n')
    token = tmp_path / "agent-token"
    token.write_text("hsk_" + "x" * 40 + "\n")
    token.chmod(0o600)
    if command[0] in ("agent", "run-attempt"):
        command = [*command, "--token-file", str(token)]
    line = error_line(run_herder(*command, cwd=tmp_path, db=sqlite_url, config=config))
    assert line == ("herder: error: [runtime] run_as: no user 'no-such-herder-user' on this "
                    "host (create it with useradd --system --create-home no-such-herder-user, "
                    "or remove the key)"), line


@as_root
def test_herder_up_refuses_an_unknown_run_as_in_one_line(tmp_path, sqlite_url):
    h = Harness(tmp_path, sqlite_url, runtime={"run_as": '"no-such-herder-user"'})
    try:
        up = h.up()
        assert h.wait_exit(up, 30, "herder up") == 2
        lines = h.stderr_of(up).strip().splitlines()
        assert lines == ["herder: error: [runtime] run_as: no user 'no-such-herder-user' on "
                         "this host (create it with useradd --system --create-home "
                         "no-such-herder-user, or remove the key)"], lines
    finally:
        h.close()


@as_root
def test_a_root_runner_without_run_as_warns_at_start(harness: Harness):
    up = harness.up()
    harness.wait_ready(up)
    assert "jobs run as root: set [runtime] run_as" in harness.stderr_of(up)


# -- jobs under run_as, end to end -----------------------------------------------------------------


@pytest.fixture
def open_root() -> Iterator[Path]:
    """A workspace root nobody may pass through to (tmp_path's parents are root's 0700)."""
    base = Path(tempfile.mkdtemp(prefix="herder-run-as-"))
    base.chmod(0o711)
    try:
        yield base / "workspaces"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def run_as_harness(tmp_path: Path, store_url: str, root: Path, extra: str = "",
                   **runtime: str) -> Harness:
    return Harness(tmp_path, store_url, runtime={
        "run_as": '"nobody"', "workspace_root": f'"{root}"', **runtime}, extra_config=extra)


def shared_folder(root: Path) -> Path:
    """Where a job as nobody writes what the test reads."""
    folder = root.parent / "shared"
    folder.mkdir(exist_ok=True)
    folder.chmod(0o777)
    return folder


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid in /proc/{pid}/status")


PROBE = """\
echo "uid=$(id -u) gid=$(id -g) home=$HOME user=$USER logname=$LOGNAME pwd=$(pwd)"
umask
for path in "$@"; do
  if cat "$path" >/dev/null 2>&1; then echo "read:$path"; else echo "denied:$path"; fi
done
if cat "/proc/$PPID/environ" >/dev/null 2>&1; then echo "read:environ"; \
  else echo "denied:environ of $PPID"; fi
printf '%s' '{"outcome": "failed", "failure_reason": "said_by_nobody", "summary": "s"}' \\
  > "$HERDER_RESULT"
"""


@as_root
def test_a_job_runs_as_run_as_writes_its_result_and_reaches_none_of_herders_files(
        tmp_path, sqlite_url, open_root):
    probe = open_root.parent / "probe.sh"
    probe.write_text(PROBE)
    probe.chmod(0o755)
    # An account's or the job type's folders come in its env (a submitter may not set HOME).
    h = run_as_harness(tmp_path, sqlite_url, open_root, extra=(
        f'[job_types.probe]\ncommand = ["/bin/sh", "{probe}", "{{a}}", "{{b}}", "{{c}}", '
        f'"{{d}}", "{{e}}"]\npreflight = false\nworkdir = "{open_root.parent}"\n'
        f'env = {{HOME = "{open_root.parent}", CLAUDE_CONFIG_DIR = "{tmp_path}"}}\n'))
    token_file = tmp_path / "agent-token"
    token_file.write_text("hsk_secret\n")
    token_file.chmod(0o600)
    database = Path(sqlite_url.removeprefix("sqlite:///"))
    try:
        # The first job leaves a result beside its log; the second tries to read it.
        first = h.submit(shell("echo '{\"summary\": \"first\"}' > \"$HERDER_RESULT\""),
                         workdir=None, max_attempts=1)
        up = h.up()
        h.wait_status(first, JobStatus.DONE)
        first_result = h.log_dir / str(first) / "1.result.json"
        assert json.loads(first_result.read_text()) == {"summary": "first"}
        secrets = [database, h.log_dir / str(first) / "1.log", first_result, token_file,
                   h.config]
        assert all(path.exists() for path in secrets)  # root reads them: the job may not
        # An account's folders come in its env: its own HOME wins over the user's, and a
        # folder the user does not own is named (not shown) in the log.
        job_id = h.client.submit("probe", payload=dict(zip("abcde", map(str, secrets),
                                                           strict=True)),
                                 max_attempts=1).job_id
        job = h.wait_status(job_id, JobStatus.FAILED)
        up.send_signal(signal.SIGTERM)
        h.wait_exit(up, 30, "herder up")
        [attempt] = h.attempts(job_id)
    finally:
        h.close()
    log = (h.log_dir / str(job_id) / "1.log").read_text()
    user = nobody()
    assert user is not None
    assert (f"uid={NOBODY} gid={user.pw_gid} home={open_root.parent} user=nobody "
            f"logname=nobody pwd={open_root.parent}\n") in log, log
    assert ("# herder: CLAUDE_CONFIG_DIR names a folder run_as user nobody does not own: "
            "the job may not write it (chown it to nobody)\n") in log, log
    notes = [line for line in log.splitlines() if " names a folder " in line]
    assert [note.split()[2] for note in notes] == ["CLAUDE_CONFIG_DIR", "HOME"], notes
    assert not [note for note in notes if str(tmp_path) in note or str(open_root) in note]
    assert "\n0022\n" in log, log
    for path in secrets:
        assert f"denied:{path}\n" in log, log
    # $PPID is `herder up` itself (the job's sh is its child): its environment is root's.
    assert f"\ndenied:environ of {up.pid}\n" in log, log
    assert "\nread:" not in log, log
    assert job.failure_reason == "said_by_nobody"  # the result decided, so it was read
    assert attempt.outcome is Outcome.FAILED
    assert (h.log_dir / str(job_id) / "1.result.json").stat().st_uid == 0
    assert not list((open_root / "runs").iterdir())  # each job's folder removed at its end


def memory_modes() -> list[str]:
    return ["watchdog", "cgroup"]


@as_root
@pytest.mark.parametrize("mode", memory_modes())
def test_cancel_and_the_cgroup_reach_every_process_of_a_run_as_job(
        tmp_path, store_url, open_root, mode):
    if mode == "cgroup" and detect() is None:
        pytest.skip("no writable memory cgroup on this machine")
    h = run_as_harness(tmp_path, store_url, open_root,
                       memory_enforcement=f'"{mode}"', memory_sample_interval='"0.2s"')
    try:
        escapee = shared_folder(open_root) / "escapee.pid"
        script = (f"setsid env -i /bin/sh -c 'echo $$ > {escapee}; exec sleep 300' "
                  "</dev/null >/dev/null 2>&1 & sleep 300 & wait")
        job_id = h.submit(shell(script), workdir=None)
        up = h.up()
        h.wait_status(job_id, JobStatus.RUNNING)
        tree: list[Proc] = wait_for(
            lambda: len(found := [p for p in h.marked(job_id) if p.argv[:1] == ("sleep",)]) == 1
            and escapee.exists() and escapee.read_text().strip() and found,
            20, "the job's sleep and its escapee", h.describe)
        pid = int(escapee.read_text())
        assert {uid_of(p.pid) for p in tree} | {uid_of(pid)} == {NOBODY}
        if mode == "cgroup":
            assert "herder-" in Path(f"/proc/{pid}/cgroup").read_text()
        h.cli("cancel", str(job_id))
        h.wait_status(job_id, JobStatus.CANCELLED)
        assert [p for p in tree if p.alive()] == []
        if mode == "cgroup":  # left the session and its marker: only the cgroup finds it
            wait_for(lambda: not Path(f"/proc/{pid}").exists() or "Z" in Path(
                f"/proc/{pid}/stat").read_text().split(")")[-1][:3], 20,
                "the escapee to be killed", h.describe)
        else:
            os.kill(pid, signal.SIGKILL)
        up.send_signal(signal.SIGTERM)
        h.wait_exit(up, 30, "herder up")
        [attempt] = h.attempts(job_id)
    finally:
        h.close()
    assert attempt.outcome is Outcome.CANCELLED
    assert attempt.memory is not None
    if mode == "cgroup":
        assert attempt.memory.enforcement in (Enforcement.CGROUP_V1, Enforcement.CGROUP_V2)


@as_root
def test_a_timeout_and_a_dead_runner_s_guardian_stop_run_as_jobs(tmp_path, store_url, open_root):
    h = run_as_harness(tmp_path, store_url, open_root)
    try:
        timed = h.submit(shell("sleep 300 & wait"), workdir=None, timeout_seconds=1.0,
                         max_attempts=1)
        orphan = h.submit(shell("sleep 300 & wait"), workdir=None)
        up = h.up()
        job = h.wait_status(timed, JobStatus.FAILED)
        assert job.failure_reason == "timeout", job
        tree = wait_for(lambda: len(found := h.marked(orphan)) == 2 and found, 20,
                        "the second job's sh and sleep", h.describe)
        assert {uid_of(p.pid) for p in tree} == {NOBODY}
        os.kill(up.pid, signal.SIGKILL)  # its guardian (root, another session) stays
        up.wait(timeout=10)
        wait_for(lambda: not any(p.alive() for p in tree), 30,
                 "the guardian to stop the dead runner's run_as job", h.describe)
    finally:
        h.close()


COMMITTER = """\
#!/bin/sh
# Commits in its checkout as the run_as user, then fails (so its checkout is kept).
out="$1"
{ id -u; pwd; stat -c %u .; } > "$out.tmp"
echo change > CHANGED
git add CHANGED && git -c user.name=j -c user.email=j@example.com commit -qm job \\
  && echo "committed $(git rev-parse HEAD) $(git remote get-url origin)" >> "$out.tmp"
git status --porcelain >> "$out.tmp"
mv "$out.tmp" "$out"
exit "${EXIT:-0}"
"""


def committer_types(folder: Path, origin: Path) -> str:
    script = folder / "committer"
    script.write_text(COMMITTER)
    script.chmod(0o755)
    return "".join(
        f'[job_types.{mode}]\ncommand = ["{script}", "{{out}}"]\n'
        'env = { EXIT = "{exit}" }\nmax_attempts = 1\npreflight = false\n'
        f'workspace = {{ repository = "{origin}", ref = "main", mode = "{mode}" }}\n\n'
        for mode in ("worktree", "clone"))


def make_origin(folder: Path) -> Path:
    """A bare repository with one commit on main, readable to root's git only."""
    origin = folder / "origin.git"
    work = folder / "seed"
    for args in (["init", "-q", "--bare", "--initial-branch=main", str(origin)],
                 ["init", "-q", "--initial-branch=main", str(work)]):
        subprocess.run(["git", *args], check=True)
    (work / "README.md").write_text("tree\n")
    for args in (["add", "."], ["-c", "user.name=t", "-c", "user.email=t@example.com",
                                "commit", "-qm", "first"], ["push", "-q", str(origin), "main"]):
        subprocess.run(["git", *args], cwd=work, check=True)
    return origin


@as_root
def test_a_run_as_job_commits_in_its_checkout_and_the_next_preparation_and_sweep_work(
        tmp_path, sqlite_url, open_root):
    origin = make_origin(tmp_path)
    h = run_as_harness(tmp_path, sqlite_url, open_root,
                       committer_types(shared_folder(open_root), origin),
                       workspace_keep_failed='"0.5s"')
    outs = shared_folder(open_root)
    try:
        up = h.up("--concurrency", "1")
        kept = h.client.submit("clone", payload={"out": str(outs / "a"), "exit": 1}).job_id
        h.wait_status(kept, JobStatus.FAILED, timeout=60)
        assert (outs / "a").exists(), (h.log_dir / str(kept) / "1.log").read_text()
        lines = (outs / "a").read_text().splitlines()
        assert lines[0] == str(NOBODY) and lines[2] == str(NOBODY), lines
        assert lines[3:] == [f"committed {lines[3].split()[1]} {origin}"], lines  # all of it
        checkout = Path(lines[1])
        # Kept for inspection, but herder's again: no later job of the user gets in.
        assert (checkout.stat().st_uid, checkout.stat().st_mode & 0o777) == (0, 0o700)
        # Then a worktree of the mirror, twice: the second preparation runs after the first
        # job's checkout was handed over (git's safe.directory must not stop it).
        done = []
        for name in ("b", "c"):
            job_id = h.client.submit("worktree", payload={"out": str(outs / name),
                                                           "exit": 0}).job_id
            done.append(h.wait_status(job_id, JobStatus.DONE, timeout=60))
            said = (outs / name).read_text().splitlines()
            assert said[0] == str(NOBODY) and said[2] == str(NOBODY), said
            # Its own repository: the commit is there, the mirror never saw it.
            commit = said[3].split()[1]
            assert said[3:] == [f"committed {commit} {origin}"], said
            [mirror] = (open_root / "mirrors").glob("*.git")
            assert subprocess.run(["git", "-C", str(mirror), "cat-file", "-e", commit],
                                  check=False, capture_output=True).returncode != 0
            assert not list((mirror / "worktrees").glob("*"))  # forgotten at once
        # The sweep removes the kept checkout once its time is up.
        wait_for(lambda: not checkout.exists(), 30, "the kept checkout to be swept",
                 h.describe)
        up.send_signal(signal.SIGTERM)
        h.wait_exit(up, 30, "herder up")
    finally:
        h.close()
    assert all(job.status is JobStatus.DONE for job in done)


@as_root
def test_an_agent_s_run_as_job_cannot_read_the_token_in_the_agent_s_environment(
        make_fleet, tmp_path, store_url, open_root):
    """The agent takes its token from its environment and pops it, but /proc/<pid>/environ
    keeps what the process started with: only a job of another uid cannot read it."""
    fleet = make_fleet(tmp_path, store_url,
                       runtime={"run_as": "nobody", "workspace_root": str(open_root)})
    fleet.add_hosts({"alpha": ("--ram", "16")})
    fleet.start_server()
    agent = fleet.start_agent("alpha")
    token = fleet.tokens["alpha"]
    assert token.encode() in Path(f"/proc/{agent.pid}/environ").read_bytes()  # root reads it
    out = shared_folder(open_root) / "agent.out"
    # Its parent is its supervisor (root's, not dumpable, its environment only the marker).
    job_id = fleet.submit(["/bin/sh", "-c",
                           f"{{ id -u; cat /proc/{agent.pid}/environ || echo denied; "
                           f"cat /proc/$PPID/environ || echo denied; }} > {out} 2>&1"])
    fleet.wait_status(job_id, JobStatus.DONE, timeout=60)
    said = out.read_text()
    lines = said.splitlines()
    assert lines[0] == str(NOBODY), said
    assert lines.count("denied") == 2 and token not in said, said


@as_root
def test_a_run_as_job_is_adopted_by_the_next_agent_with_its_result(
        make_fleet, tmp_path, sqlite_url, open_root):
    """Under run_as the supervisor is root's and the job nobody's; the agent dies with -9,
    the next one adopts the job, and its $HERDER_RESULT (in the folder nobody owns) is
    collected when it ends: done, with its summary, one attempt."""
    label = f"adopt{secrets.token_hex(3)}"  # no other test's agent kills its survivors
    fleet = make_fleet(tmp_path, sqlite_url,
                       runtime={"run_as": "nobody", "workspace_root": str(open_root),
                                "attempt_lease": "30s", "adopt_grace": "60s",
                                "memory_enforcement": "watchdog"})
    fleet.add_hosts({label: ("--ram", "16")})
    fleet.start_server()
    fleet.start_agent(label)
    shared = shared_folder(open_root)
    started, release = shared / "started", shared / "release"
    job_id = fleet.submit(["/bin/sh", "-c",
                           f"id -u > {started}; while [ ! -e {release} ]; do sleep 0.05; done; "
                           "echo '{\"summary\": \"adopted and done\"}' > \"$HERDER_RESULT\""],
                          max_attempts=1)
    wait_for(lambda: started.exists() and started.read_text().strip(), 30, "the job to run",
             fleet.describe)
    assert started.read_text().strip() == str(NOBODY)
    fleet.kill_agent(label)
    fleet.wait_exit(fleet.agents[label], 30, "the killed agent")
    second = fleet.start_agent(label)
    wait_for(lambda: f"job {job_id} attempt 1: adopted" in fleet.stderr_of(second), 30,
             "the adoption", fleet.describe)
    release.touch()
    done = fleet.wait_status(job_id, JobStatus.DONE)
    assert (done.attempt, done.lost) == (1, 0)
    assert "adopted and done" in fleet.cli("show", str(job_id)).stdout
