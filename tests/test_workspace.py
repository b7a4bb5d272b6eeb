"""Issue 15 items 3 and 4: a fresh git checkout per attempt (worktree of a cached mirror or
a shallow clone), removed after success and kept after a failure; argv parts that appear
only when their payload field is set; prompt files that are templates, read at submit or
from the job's checkout on the host that runs it.

The git repositories are real, made by each test (`git init --bare`, a commit pushed to it);
the e2e tests run `herder up` on both backends and a server with an agent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.local import Harness
from support.waits import wait_for

from herder.core.errors import ConfigError, InputError
from herder.core.model import Job, JobStatus, Outcome
from herder.core.settings.loading import load_config
from herder.core.submission import SubmitRequest
from herder.core.templates import check_command, fill_prompt, render_argv
from herder.core.workspace import VARIABLE, WorkspaceSpec, of_env
from herder.runtime.agent import job_from_assignment
from herder.runtime.executor import LaunchError, spawn
from herder.runtime.process import TOKEN_VARIABLE, process_start_time
from herder.runtime.workspace import (
    SAFE_CONFIG,
    WorkspaceError,
    Workspaces,
    claim,
    fill_command,
    git_environment,
    launch,
    prepare,
    release,
    run,
    runner_alive,
    sweep,
)
from herder.services.intake import resolve

PROMPT = 'Fix issue #{issue} in {job_type}.\nKeep {"json": true} and {{issue}} as written.\n'


# -- templates (pure) ---------------------------------------------------------------------------


MODEL_COMMAND = ["agent", "-p", "{task}", ["--model", "{model}"], ["--effort={effort}"]]


@pytest.mark.parametrize(("payload", "argv"), [
    ({"task": "t", "model": "opus", "effort": "high"},
     ("agent", "-p", "t", "--model", "opus", "--effort=high")),
    ({"task": "t", "model": "opus"}, ("agent", "-p", "t", "--model", "opus")),
    ({"task": "t", "model": "", "effort": None}, ("agent", "-p", "t")),
    ({"task": "t"}, ("agent", "-p", "t")),
])
def test_an_optional_group_appears_only_when_its_field_is_set(payload, argv):
    assert render_argv(MODEL_COMMAND, payload, "job_types.a.command") == (argv, ())


def test_a_plain_item_still_needs_its_field():
    with pytest.raises(InputError) as raised:
        render_argv(MODEL_COMMAND, {"model": "opus"}, "job_types.a.command")
    assert raised.value.field == "payload.task"
    assert "job_types.a.command" in raised.value.problem


def test_a_prompt_left_for_the_host_keeps_its_placeholder_and_escapes_the_rest():
    argv, parts = render_argv(["agent", "{task}", "-p", "{prompt} ({task})", "{prompt_file}"],
                              {"task": "a{b}"}, "w", keep=("prompt", "prompt_file"))
    assert argv == ("agent", "a{b}", "-p", "{prompt} (a{{b}})", "{prompt_file}")
    assert parts == (3, 4)


def test_a_prompt_is_a_template_whose_other_braces_stay_as_written():
    text = fill_prompt(PROMPT, {"issue": 42, "job_type": "fix"}, "prompt_file")
    assert text == 'Fix issue #42 in fix.\nKeep {"json": true} and {issue} as written.\n'
    with pytest.raises(InputError) as raised:
        fill_prompt(PROMPT, {"job_type": "fix"}, "job_types.fix.prompt_file")
    assert raised.value.field == "payload.issue"
    assert "job_types.fix.prompt_file" in raised.value.problem


@pytest.mark.parametrize(("command", "says"), [
    (["a", []], "command.1: an optional group is empty"),
    (["a", ["--fast"]], "command.1: an optional group names no {field}"),
    ([["{prog}"], "x"], "command.0: the program comes first"),
    (["a", ["--model", "{mo del}"]], "is not a plain name"),
])
def test_a_malformed_command_is_refused(command, says):
    with pytest.raises(ValueError, match=None) as raised:
        check_command(command)
    assert says in str(raised.value)


# -- config and submit --------------------------------------------------------------------------


def write_config(folder: Path, text: str) -> Path:
    path = folder / "herder.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("text", "key", "says"), [
    ('[job_types.w]\ncommand = ["a"]\nworkspace = { repository = "{repo}", ref = "{ref}", '
     'mode = "copy" }\n', "job_types.w.workspace.mode", "use one of worktree, clone"),
    ('[job_types.w]\ncommand = ["a"]\nworkspace = { repository = "{repo}" }\n',
     "job_types.w.workspace.ref", "required key is missing"),
    ('[job_types.w]\ncommand = ["a"]\nworkspace = { repository = "{re po}", ref = "main" }\n',
     "job_types.w.workspace.repository", "not a plain name"),
    ('[job_types.w]\ncommand = ["a", ["--model", "{model"]]\n', "job_types.w.command",
     "bad template"),
    ('[job_types.w]\ncommand = ["a"]\nprompt_file = "p.md"\nprompt_from = "workspace"\n',
     "job_types.w", "set workspace and prompt_file"),
    ('[job_types.w]\ncommand = ["a"]\nprompt_file = "../p.md"\nprompt_from = "workspace"\n'
     'workspace = { repository = "r", ref = "main" }\n', "job_types.w", "inside the checkout"),
    ('[job_types.w]\ncommand = ["a"]\nprompt_file = "p.md"\nprompt_from = "workspace"\n'
     'env = { P = "{prompt}" }\nworkspace = { repository = "r", ref = "main" }\n',
     "job_types.w", "only the command may use {prompt}"),
    ('[job_types.w]\ncommand = ["a"]\nprompt_file = "p.md"\nprompt_from = "disk"\n',
     "job_types.w.prompt_from", "use one of submit, workspace"),
    ('[runtime]\nworkspace_min_free_gb = -1\n', "runtime.workspace_min_free_gb",
     "must be at least 0"),
])
def test_a_bad_workspace_or_template_is_a_config_error_naming_the_key(tmp_path, text, key,
                                                                      says):
    with pytest.raises(ConfigError) as raised:
        load_config(write_config(tmp_path, text))
    assert raised.value.field.endswith(key), raised.value
    assert says in raised.value.problem, raised.value


WORKSPACE_TYPES = """
[job_types.fix]
command = ["agent", "-p", "{prompt}", ["--model", "{model}"]]
prompt_file = "prompts/task.md"
prompt_from = "workspace"
workspace = { repository = "{repo}", ref = "{ref}", mode = "clone" }

[job_types.local]
command = ["agent", "-p", "{prompt}"]
prompt_file = "task.md"
"""


@pytest.fixture
def typed(tmp_path):
    (tmp_path / "task.md").write_text(PROMPT)
    return load_config(write_config(tmp_path, WORKSPACE_TYPES))


@pytest.mark.parametrize("repository", ["git@github.com:acme/app.git", "/srv/git/app.git",
                                        "https://github.com/acme/app.git", "file:///srv/a",
                                        "ssh://git@example.com:2222/app.git"])
def test_repository_locations_git_knows_are_accepted(repository):
    assert WorkspaceSpec(repository, "v1.2").problem() is None


def test_a_spec_that_was_tampered_with_is_not_run():
    with pytest.raises(ValueError, match="starts with '-'"):
        WorkspaceSpec.decode(json.dumps({"repository": "/srv/a", "ref": "--output=x"}))
    with pytest.raises(ValueError, match="not a workspace spec"):
        WorkspaceSpec.decode("[1]")


def test_a_submitted_workspace_travels_in_the_jobs_env(typed):
    spec = resolve(typed, SubmitRequest(job_type="fix", payload={
        "repo": "git@example.com:team/app.git", "ref": "main", "model": "opus"}))
    assert spec.command == ("agent", "-p", "{prompt}", "--model", "opus")
    assert spec.workdir is None  # the host's fresh checkout
    assert of_env(spec.env) == WorkspaceSpec("git@example.com:team/app.git", "main", "clone",
                                             "prompts/task.md", (2,))


@pytest.mark.parametrize(("payload", "field", "says"), [
    ({"repo": "/srv/app.git"}, "payload.ref", "workspace.ref needs payload field 'ref'"),
    ({"repo": "/srv/app.git", "ref": "--upload-pack=evil"}, "job_types.fix.workspace.ref",
     "starts with '-'"),
    ({"repo": "-oProxyCommand=x", "ref": "main"}, "job_types.fix.workspace.repository",
     "starts with '-'"),
    ({"repo": "/srv/app.git", "ref": "main:refs/heads/x"}, "job_types.fix.workspace.ref",
     "not a branch, tag or commit"),
    ({"repo": "https://bot:s3cret@example.com/app.git", "ref": "main"},
     "job_types.fix.workspace.repository", "holds a credential"),
    ({"repo": "https://ghp_0123456789@github.com/acme/app.git", "ref": "main"},
     "job_types.fix.workspace.repository", "holds a credential"),
    ({"repo": "ssh://git:pw@example.com/app.git", "ref": "main"},
     "job_types.fix.workspace.repository", "holds a credential"),
    ({"repo": "repos/app.git", "ref": "main"}, "job_types.fix.workspace.repository",
     "nor an absolute path"),
])
def test_a_workspace_value_git_must_not_see_is_an_input_error(typed, payload, field, says):
    with pytest.raises(InputError) as raised:
        resolve(typed, SubmitRequest(job_type="fix", payload=payload))
    assert raised.value.field == field
    assert says in raised.value.problem


def test_a_submitter_cannot_set_the_workspace_or_a_workdir_for_it(typed):
    with pytest.raises(InputError) as raised:
        resolve(typed, SubmitRequest(command=["true"], env={VARIABLE: "{}"}))
    assert raised.value.field == f"env.{VARIABLE}"
    with pytest.raises(InputError) as raised:
        resolve(typed, SubmitRequest(job_type="fix", workdir="/tmp",
                                     payload={"repo": "git@example.com:app.git", "ref": "main"}))
    assert raised.value.field == "workdir"


def test_a_prompt_read_at_submit_is_filled_from_the_payload(typed, tmp_path):
    spec = resolve(typed, SubmitRequest(job_type="local", payload={"issue": 7}),
                   check_command=False)
    assert spec.command[2].startswith("Fix issue #7 in local.\n")


# -- real git -----------------------------------------------------------------------------------


def run_git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def make_repository(folder: Path, prompt: str = PROMPT) -> Path:
    """A bare repository with one commit on `main`: README.md and prompts/task.md."""
    origin = folder / "origin.git"
    run_git("init", "--quiet", "--bare", "--initial-branch=main", str(origin))
    work = folder / "seed"
    run_git("init", "--quiet", "--initial-branch=main", str(work))
    (work / "README.md").write_text("the checked-out tree\n")
    (work / "prompts").mkdir()
    (work / "prompts" / "task.md").write_text(prompt)
    (work / "run.sh").write_text("#!/bin/sh\nexit 0\n")
    run_git("add", ".", cwd=work)
    run_git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "--quiet",
            "-m", "first", cwd=work)
    run_git("push", "--quiet", str(origin), "main", cwd=work)
    return origin


@pytest.fixture
def origin(tmp_path) -> Path:
    return make_repository(tmp_path)


@pytest.mark.parametrize("mode", ["worktree", "clone"])
def test_prepare_checks_out_the_ref_and_reads_the_prompt_from_it(tmp_path, origin, mode):
    root = tmp_path / "workspaces"
    spec = WorkspaceSpec(str(origin), "main", mode, "prompts/task.md", (1,))
    folders = [root / "attempts" / f"1.{n}" for n in (1, 2)]
    commits = {prepare(spec, root, folder, 0.0) for folder in folders}
    assert commits == {run_git("rev-parse", "main", cwd=origin).strip()}
    for folder in folders:  # each attempt its own tree
        assert (folder / "README.md").read_text() == "the checked-out tree\n"
    env = {"HERDER_PAYLOAD": json.dumps({"issue": 42}), "HERDER_JOB_TYPE": "fix"}
    argv = fill_command(["agent", "{prompt}"], spec, False, folders[0], env)
    assert argv == ["agent", 'Fix issue #42 in fix.\nKeep {"json": true} and {issue} as '
                             "written.\n"]
    shell = fill_command(["/bin/sh", "-c", "echo {prompt_file} {{x}}"],
                         WorkspaceSpec(str(origin), "main", mode, "prompts/task.md", (2,)),
                         True, folders[0], env)
    assert shell[2] == f"echo {(folders[0] / 'prompts' / 'task.md').resolve()} {{x}}"
    mirrors = list((root / "mirrors").glob("*.git"))
    assert len(mirrors) == (1 if mode == "worktree" else 0)


@pytest.mark.parametrize(("mode", "message"), [("worktree", "invalid reference: nosuch"),
                                               ("clone", "couldn't find remote ref nosuch")])
def test_a_ref_that_does_not_exist_fails_with_gits_message(tmp_path, origin, mode, message):
    with pytest.raises(WorkspaceError) as raised:
        prepare(WorkspaceSpec(str(origin), "nosuch", mode), tmp_path / "w",
                tmp_path / "w" / "attempts" / "1.1", 0.0)
    assert message in str(raised.value)


def test_a_full_disk_and_a_prompt_that_leaves_the_checkout_fail_the_workspace(tmp_path, origin):
    spec = WorkspaceSpec(str(origin), "main", "clone", "prompts/task.md", (1,))
    with pytest.raises(WorkspaceError) as raised:
        prepare(spec, tmp_path / "w", tmp_path / "w" / "attempts" / "1.1", 1e9)
    assert "workspace_min_free_gb is 1e+09" in str(raised.value)
    folder = tmp_path / "w" / "attempts" / "1.2"
    prepare(spec, tmp_path / "w", folder, 0.0)
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    (folder / "prompts" / "task.md").unlink()
    (folder / "prompts" / "task.md").symlink_to(secret)
    with pytest.raises(WorkspaceError) as raised:
        fill_command(["a", "{prompt}"], spec, False, folder, {})
    assert "leads out of the checkout" in str(raised.value)


def preparing_request(tmp_path: Path, origin: Path, ref: str, payload: dict) -> dict:
    spec = WorkspaceSpec(str(origin), ref, "clone", "prompts/task.md", (1,))
    return {"argv": ["agent", "{prompt}"], "shell": False, "spec": spec.encode(),
            "root": str(tmp_path / "w"), "folder": str(tmp_path / "w" / "attempts" / "1.1"),
            "min_free_gb": 0.0,
            "env": {"HERDER_RESULT": str(tmp_path / "result.json"),
                    "HERDER_PAYLOAD": json.dumps(payload), "HERDER_JOB_TYPE": "fix"}}


def test_the_preparing_process_says_how_it_failed_in_the_log_and_the_result(tmp_path, origin,
                                                                           capsys):
    assert run(preparing_request(tmp_path, origin, "nosuch", {"issue": 1})) == 6
    assert "# herder: workspace failed: git fetch failed" in capsys.readouterr().out
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["outcome"] == "workspace_failed"
    assert "couldn't find remote ref nosuch" in result["summary"]


def test_a_prompt_missing_its_field_fails_the_job_not_the_workspace(tmp_path, origin, capsys):
    assert run(preparing_request(tmp_path, origin, "main", {})) == 1
    assert "# herder: prompt failed: payload.issue" in capsys.readouterr().out
    result = json.loads((tmp_path / "result.json").read_text())
    assert (result["outcome"], result["failure_reason"]) == ("failed", "prompt_template")


def test_git_gets_the_hosts_environment_without_herders_own():
    env = git_environment({"HOME": "/home/u", "SSH_AUTH_SOCK": "/s", "HERDER_DB": "postgres://x",
                           "HERDER_AGENT_TOKEN": "hdr_x"})
    assert env["HOME"] == "/home/u" and env["SSH_AUTH_SOCK"] == "/s"
    assert not [name for name in env if name.startswith("HERDER_")]
    assert env["GIT_TERMINAL_PROMPT"] == "0" and "ext" not in env["GIT_ALLOW_PROTOCOL"]
    assert env["GIT_HTTP_LOW_SPEED_TIME"] == "60"
    assert git_environment({"GIT_HTTP_LOW_SPEED_TIME": "600"})["GIT_HTTP_LOW_SPEED_TIME"] == (
        "600")  # the host's own setting stands


def test_a_succeeded_checkout_goes_and_a_failed_one_stays_until_its_time(tmp_path):
    attempts = tmp_path / "attempts"
    ok, failed, orphan = attempts / "1.1", attempts / "2.1", attempts / "3.1"
    for folder in (ok, failed, orphan):
        claim(folder, "h/1/1")
        folder.mkdir(parents=True)
        (folder / "file").write_text("x")
    assert release(ok, True, 3600, 1000.0) is None
    assert not ok.exists()
    said = release(failed, False, 3600, 1000.0)
    assert said is not None and str(failed) in said
    owners = {"h/1/1": True}
    assert sweep(tmp_path, 4599.0, 3600, owners.__getitem__) == 0
    assert failed.exists() and orphan.exists()
    assert sweep(tmp_path, 4600.0, 3600, owners.__getitem__) == 1
    assert not failed.exists() and orphan.exists()
    owners["h/1/1"] = False  # its runner died without releasing it: kept, then swept
    assert sweep(tmp_path, 5000.0, 3600, owners.__getitem__) == 0
    assert orphan.exists()
    assert sweep(tmp_path, 8600.0, 3600, owners.__getitem__) == 1
    assert not list(attempts.iterdir())


def test_a_runner_is_alive_while_its_pid_has_its_start_time():
    me = os.getpid()
    assert runner_alive(f"h/{me}/{process_start_time(me)}")
    assert not runner_alive(f"h/{me}/1") and not runner_alive("garbage")


# -- end to end ---------------------------------------------------------------------------------

FAKE_AGENT = """\
#!/bin/sh
# Records where it ran, what the checkout holds and its arguments; exits with $EXIT.
out="$1"; shift
{ pwd; cat README.md; for arg in "$@"; do printf 'arg:%s\\n' "$arg"; done; } > "$out"
exit "${EXIT:-0}"
"""


def agent_types(folder: Path, origin: Path) -> str:
    script = folder / "fake-agent"
    script.write_text(FAKE_AGENT)
    script.chmod(0o755)
    common = (f'command = ["{script}", "{{out}}", "-p", "{{prompt}}", ["--model", "{{model}}"]]\n'
              'prompt_file = "prompts/task.md"\nprompt_from = "workspace"\n'
              'env = { EXIT = "{exit}" }\nmax_attempts = 1\npreflight = false\n')
    return "".join(
        f'[job_types.{mode}]\n{common}workspace = {{ repository = "{origin}", '
        f'ref = "{{ref}}", mode = "{mode}" }}\n\n' for mode in ("worktree", "clone"))


def checkouts(root: Path) -> list[str]:
    folder = root / "attempts"
    return sorted(path.name for path in folder.iterdir()) if folder.exists() else []


def read_log(log_dir: Path, job_id: int) -> str:
    return (log_dir / str(job_id) / "1.log").read_text()


@pytest.mark.slow
def test_herder_up_runs_each_attempt_in_a_fresh_checkout(tmp_path, store_url):
    origin = make_repository(tmp_path)
    h = Harness(tmp_path, store_url, runtime={"workspace_keep_failed": '"1h"'},
                extra_config=agent_types(tmp_path, origin))
    root = tmp_path / "herder-workspaces"
    try:
        outs = {name: tmp_path / f"{name}.out" for name in ("ok", "failed", "clone")}
        ok = h.client.submit("worktree", payload={
            "ref": "main", "out": str(outs["ok"]), "exit": 0, "model": "opus", "issue": 7}).job_id
        failed = h.client.submit("worktree", payload={
            "ref": "main", "out": str(outs["failed"]), "exit": 1, "issue": 8}).job_id
        bad_ref = h.client.submit("clone", payload={
            "ref": "nosuch", "out": str(tmp_path / "never"), "exit": 0, "issue": 9}).job_id
        up = h.up("--concurrency", "1")
        try:
            done = h.wait_status(ok, JobStatus.DONE, timeout=60)
            lines = outs["ok"].read_text().splitlines()
            assert Path(lines[0]).parent == root / "attempts"
            assert lines[1] == "the checked-out tree"
            assert lines[2:] == ["arg:-p", "arg:Fix issue #7 in worktree.",
                                 'Keep {"json": true} and {issue} as written.', "",
                                 "arg:--model", "arg:opus"]
            assert Path(lines[0]).name not in checkouts(root)  # removed after success
            assert "# herder: workspace " in read_log(h.log_dir, done.id)

            h.wait_status(failed, JobStatus.FAILED, timeout=60)
            kept = Path(outs["failed"].read_text().splitlines()[0])
            assert kept.is_dir() and (kept / "README.md").exists()
            assert "--model" not in outs["failed"].read_text()  # no model: no flag
            assert f"workspace kept for inspection for 3600s: {kept}" in read_log(h.log_dir,
                                                                                 failed)

            # A ref that does not exist: workspace_failed, git's message in the log, the
            # job back in the queue on its spawn budget; the runner goes on.
            job = wait_for(lambda: (j := h.job(bad_ref)) and j.spawn_failures == 1 and j, 60,
                           "the bad ref to fail its workspace", h.describe)
            assert (job.status, job.failure_reason, job.failures) == (
                JobStatus.QUEUED, "spawn_git_auth", 0)
            assert [a.outcome for a in h.attempts(bad_ref)] == [Outcome.WORKSPACE_FAILED]
            assert "couldn't find remote ref nosuch" in read_log(h.log_dir, bad_ref)
            assert not (tmp_path / "never").exists()
            h.cli("cancel", str(bad_ref))

            after = h.client.submit("clone", payload={
                "ref": "main", "out": str(outs["clone"]), "exit": 0, "issue": 10}).job_id
            h.wait_status(after, JobStatus.DONE, timeout=60)
            assert outs["clone"].read_text().splitlines()[1] == "the checked-out tree"
            assert up.poll() is None
        finally:
            up.send_signal(signal.SIGTERM)
            h.wait_exit(up, 30, "herder up")
        left = checkouts(root)
        folders = [name for name in left if not name.endswith((".kept", ".owner"))]
        assert kept.name in folders  # the failures' checkouts stay, each with its time
        assert all(f"{name}.kept" in left for name in folders)
        assert not [name for name in left if name.startswith((f"{ok}.", f"{after}."))]
    finally:
        h.close()


@pytest.mark.slow
def test_an_agent_prepares_the_workspace_on_its_host(make_fleet, tmp_path, store_url):
    origin = make_repository(tmp_path)
    fleet = make_fleet(tmp_path, store_url, fleet={"spawn_backoff": "1h"},
                       extra=agent_types(tmp_path, origin))
    fleet.add_hosts({"alpha": ("--ram", "16")})
    fleet.start_server()
    fleet.start_agent("alpha")
    out = tmp_path / "agent.out"
    job_id = fleet.submit(job_type="worktree", payload={
        "ref": "main", "out": str(out), "exit": 0, "model": "sonnet", "issue": 11})
    fleet.wait_status(job_id, JobStatus.DONE, timeout=60)
    lines = out.read_text().splitlines()
    root = tmp_path / "agents" / "herder-workspaces"
    assert Path(lines[0]).parent == root / "attempts"
    assert lines[1:4] == ["the checked-out tree", "arg:-p", "arg:Fix issue #11 in worktree."]
    assert lines[-2:] == ["arg:--model", "arg:sonnet"]
    assert not Path(lines[0]).exists()

    bad = fleet.submit(job_type="worktree", payload={
        "ref": "nosuch", "out": str(tmp_path / "never"), "exit": 0, "issue": 12})
    job = wait_for(lambda: (j := fleet.job(bad)) and j.spawn_failures == 1 and j, 60,
                   "the bad ref to fail its workspace on the agent", fleet.describe)
    assert (job.status, job.failure_reason) == (JobStatus.QUEUED, "spawn_git_auth")
    assert [a.outcome for a in fleet.attempts(bad)] == [Outcome.WORKSPACE_FAILED]
    log = fleet.cli("logs", str(bad)).stdout
    assert "invalid reference: nosuch" in log, log
    assert fleet.agents["alpha"].poll() is None


def a_job(env: dict[str, str], command: list[str]) -> Job:
    stamp = datetime.now(UTC).isoformat()
    return job_from_assignment({
        "id": 7, "attempt": 2, "job_type": "fix", "command": command, "shell": False,
        "payload": {"issue": 42}, "priority": 100, "weight": "light", "ram_gb": 3.0,
        "env": env, "workdir": None, "timeout_seconds": None, "max_attempts": 3,
        "failures": 0, "lost": 0, "spawn_failures": 0, "backoff_base_seconds": 10.0,
        "backoff_max_seconds": 600.0, "available_at": stamp, "created_at": stamp,
        "updated_at": stamp,
    })


def test_the_jobs_env_reaches_its_command_but_never_git(tmp_path, origin):
    """The preparing process runs git with the host's environment; the job's own env (a
    submitter's secret) reaches it on stdin and only the command it execs sees it."""
    spec = WorkspaceSpec(str(origin), "main", "worktree", "prompts/task.md", (2,))
    job = a_job({"SUBMITTED_SECRET": "s3cret", VARIABLE: spec.encode()},
                ["/bin/sh", "-c", "{prompt}", "sh"])
    workspaces = Workspaces(tmp_path / "w", 60.0, 0.0)
    plan = launch(job, spec, {"SUBMITTED_SECRET": "s3cret"}, TOKEN_VARIABLE, "7.2@h/1/1",
                  workspaces, runner_environment={"HOME": "/home/u", "HERDER_DB": "x"})
    assert "SUBMITTED_SECRET" not in plan.env and "HERDER_DB" not in plan.env
    assert plan.env[TOKEN_VARIABLE] == "7.2@h/1/1" and b"s3cret" in plan.stdin

    (tmp_path / "prompt-repo").mkdir()
    script_repo = make_repository(tmp_path / "prompt-repo",
                                  prompt='echo "$SUBMITTED_SECRET #{issue}"; pwd\n')
    spec = WorkspaceSpec(str(script_repo), "main", "clone", "prompts/task.md", (2,))
    job = a_job({"SUBMITTED_SECRET": "s3cret", VARIABLE: spec.encode()},
                ["/bin/sh", "-c", "{prompt}", "sh"])
    attempt = spawn(job, "h", "h/1/1", tmp_path / "logs", 1.0, workspaces=workspaces)
    assert attempt.process.wait(timeout=60) == 0
    log = attempt.log_path.read_text().splitlines()
    assert log[-2:] == ["s3cret #42", str(attempt.workspace)]
    assert attempt.workspace is not None and attempt.workspace.parent == tmp_path / "w" / "attempts"


# -- where a workspace may come from (issue 23) -----------------------------------------------

PREFIXED = """
[job_types.fix]
command = ["agent"]
workspace = { repository = "{repo}", ref = "main" }
repositories = ["https://github.com/acme/", "git@github.com:acme/"]

[job_types.anywhere]
command = ["agent"]
workspace = { repository = "{repo}", ref = "main" }

[job_types.local]
command = ["agent"]
workspace = { repository = "{repo}", ref = "main" }
allow_local_repositories = true
"""


@pytest.fixture
def prefixed(tmp_path):
    return load_config(write_config(tmp_path, PREFIXED))


@pytest.mark.parametrize("repo", [
    "https://github.com/acme/app.git", "https://GitHub.com:443/acme/app", "git@github.com:acme/x",
    "ssh://git@github.com/acme/x.git",
])
def test_a_repository_under_a_prefix_is_accepted(prefixed, repo):
    spec = resolve(prefixed, SubmitRequest(job_type="fix", payload={"repo": repo}),
                   check_command=False)
    assert of_env(spec.env).repository == repo


@pytest.mark.parametrize(("job_type", "repo", "says"), [
    ("fix", "https://github.com/acme/../evil/app.git", "'..'"),
    ("fix", "https://github.com/acme/%2e%2e/evil", "'..'"),
    ("fix", "https://github.com/acme%2fevil/x", "escaped '/'"),
    ("fix", "https://github.com/acmeevil/app.git", "not under any"),
    ("fix", "https://github.com.evil.example/acme/app", "not under any"),
    ("fix", "https://github.com:8443/acme/app", "not under any"),
    ("fix", "http://github.com/acme/app", "not under any"),
    ("fix", "git@evil.example:acme/app", "not under any"),
    ("fix", "ssh://git@github.com:acme@evil.example/acme/x", "password"),
    ("fix", "https://github.com:99999/acme/x", "bad port"),
    ("anywhere", "/srv/git/app.git", "allow_local_repositories = true"),
    ("anywhere", "file:///srv/git/app.git", "allow_local_repositories = true"),
    ("local", "ext::sh -c touch% /tmp/pwned", "transport helper"),
    ("local", "fd::7", "transport helper"),
    ("local", "-uhack", "starts with '-'"),
])
def test_a_repository_the_job_type_does_not_allow_is_refused(prefixed, job_type, repo, says):
    with pytest.raises(InputError) as raised:
        resolve(prefixed, SubmitRequest(job_type=job_type, payload={"repo": repo}),
                check_command=False)
    assert raised.value.field == f"job_types.{job_type}.workspace.repository"
    assert says in raised.value.problem


def test_a_local_repository_needs_the_job_type_to_allow_it(prefixed):
    spec = resolve(prefixed, SubmitRequest(job_type="local", payload={"repo": "/srv/a.git"}),
                   check_command=False)
    assert of_env(spec.env).repository == "/srv/a.git"


# -- one attempt cannot poison the next (issue 23) ---------------------------------------------


def plant(folder: Path, markers: Path, evil_origin: Path, origin: Path) -> Path:
    """What a hostile job under herder's own user does from its checkout: finds the mirror
    it shares with later attempts on this host (its objects are the checkout's alternates)
    and plants everything git would run or read there. The mirror's path."""
    alternates = folder / ".git" / "objects" / "info" / "alternates"
    mirror = Path(alternates.read_text().strip()).parent

    def script(name: str, body: str = "") -> str:
        path = markers / f"{name}.sh"
        path.write_text(f"#!/bin/sh\ntouch {markers / name}\n{body}")
        path.chmod(0o755)
        return str(path)

    (mirror / "hooks").mkdir(exist_ok=True)
    for hook in ("post-checkout", "reference-transaction", "pre-auto-gc"):
        (mirror / "hooks" / hook).write_text(Path(script("hook")).read_text())
        (mirror / "hooks" / hook).chmod(0o755)
    other_hooks = markers / "hooks"
    other_hooks.mkdir()
    (other_hooks / "post-checkout").write_text(Path(script("hooks-path")).read_text())
    (other_hooks / "post-checkout").chmod(0o755)
    (markers / "included").write_text(f"[core]\n\thooksPath = {other_hooks}\n")
    for key, value in [("core.fsmonitor", script("fsmonitor")),
                       ("filter.evil.smudge", script("filter", "cat\n")),
                       ("core.sshCommand", script("ssh")),
                       ("include.path", str(markers / "included")),
                       (f"url.{evil_origin}.insteadOf", str(origin))]:
        run_git("config", "--file", str(mirror / "config"), key, value)
    (mirror / "info").mkdir(exist_ok=True)
    (mirror / "info" / "attributes").write_text("* filter=evil\n")
    return mirror


def test_a_job_that_plants_hooks_and_config_in_the_mirror_runs_none_of_them(tmp_path, origin):
    """Issue 23: a post-checkout hook planted by one attempt ran while the next attempt's
    checkout was prepared. Real git, real processes: attempt 1 plants hooks, a hooksPath
    (by an include), an fsmonitor, a filter and a URL rewrite to another repository in the
    mirror; plain git would run them (checked), herder's preparation of attempt 2 runs
    none and checks out the real commit."""
    (tmp_path / "evil-src").mkdir()
    evil = make_repository(tmp_path / "evil-src")
    evil_seed = tmp_path / "evil-src" / "seed"
    (evil_seed / "README.md").write_text("poisoned\n")
    run_git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qam", "evil",
            cwd=evil_seed)
    run_git("push", "--quiet", str(evil), "main", cwd=evil_seed)
    markers = tmp_path / "markers"
    markers.mkdir()
    root = tmp_path / "w"
    spec = WorkspaceSpec(str(origin), "main", "worktree")
    first = root / "attempts" / "1.1"
    prepare(spec, root, first, 0.0)
    # What an ordinary tool does in its checkout (husky, pre-commit) stays in it.
    run_git("config", "core.hooksPath", str(markers / "hooks"), cwd=first)
    assert run_git("remote", "get-url", "origin", cwd=first).strip() == str(origin)
    mirror = plant(first, markers, evil, origin)

    control = subprocess.run(["git", "-c", "core.fsmonitor=false", "-C", str(mirror),
                              "worktree", "add", "--detach", str(tmp_path / "control"),
                              "main"], capture_output=True, text=True, check=False,
                             env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1"})
    assert control.returncode == 0, control.stderr
    ran = {path.name for path in markers.iterdir() if not path.suffix and path.is_file()}
    assert {"hooks-path", "filter"} <= ran  # what the plant does to plain git
    for name in ran:
        (markers / name).unlink()

    second = root / "attempts" / "1.2"
    commit = prepare(spec, root, second, 0.0)
    assert commit == run_git("rev-parse", "main", cwd=origin).strip()
    assert (second / "README.md").read_text() == "the checked-out tree\n"
    assert run_git("-C", str(second), "status", "--porcelain", "--untracked-files=no") == ""
    ran = sorted(path.name for path in markers.iterdir() if not path.suffix and path.is_file())
    assert ran == [], f"planted commands ran: {ran}"
    config = (mirror / "config").read_text()
    assert "fsmonitor" not in config and "evil" not in config and "include" not in config
    assert not (mirror / "info" / "attributes").exists()
    assert not (mirror / "hooks").exists()
    assert "hooksPath" not in (second / ".git" / "config").read_text()


def test_git_runs_with_hooks_fsmonitor_and_other_config_off():
    env = git_environment({"HOME": "/home/u", "HERDER_DB": "x"})
    assert env["GIT_CONFIG_NOSYSTEM"] == "1" and env["GIT_CONFIG_GLOBAL"] == os.devnull
    assert env["GIT_NO_REPLACE_OBJECTS"] == "1"
    # A global config the operator names (a file jobs cannot write) is kept.
    kept = git_environment({"GIT_CONFIG_GLOBAL": "/etc/herder/gitconfig"})
    assert kept["GIT_CONFIG_GLOBAL"] == "/etc/herder/gitconfig"
    assert ("core.hooksPath", "/dev/null") in SAFE_CONFIG
    assert ("core.fsmonitor", "false") in SAFE_CONFIG


def test_a_workdir_whose_symlink_leads_out_of_its_base_is_a_launch_failure(tmp_path):
    """Checked again on the host that runs it, with symlinks resolved: the link may have
    appeared after the submit (an earlier job made it), or on another machine."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "app").mkdir()
    (base / "out").symlink_to(tmp_path)
    marker = tmp_path / "ran"
    stamp = datetime.now(UTC).isoformat()

    def job(workdir: Path) -> Job:
        return job_from_assignment({
            "id": 8, "attempt": 1, "job_type": "based", "command": ["touch", str(marker)],
            "shell": False, "payload": {}, "priority": 100, "weight": "light", "ram_gb": 1.0,
            "env": {"HERDER_WORKDIR_BASE": str(base)}, "workdir": str(workdir),
            "timeout_seconds": None, "max_attempts": 1, "failures": 0, "lost": 0,
            "spawn_failures": 0, "backoff_base_seconds": 1.0, "backoff_max_seconds": 1.0,
            "available_at": stamp, "created_at": stamp, "updated_at": stamp})

    with pytest.raises(LaunchError) as raised:
        spawn(job(base / "out"), "h", "h/1/1", tmp_path / "logs", 1.0)
    assert f"leads out of workdir_base {base}" in str(raised.value)
    assert "launch failed" in (tmp_path / "logs" / "8" / "1.log").read_text()
    assert not marker.exists()
    attempt = spawn(job(base / "app"), "h", "h/1/1", tmp_path / "logs2", 1.0)
    assert attempt.process.wait(timeout=30) == 0 and marker.exists()


def test_a_shell_job_reads_a_prompt_from_its_checkout_as_a_variable(tmp_path):
    """prompt_from = "workspace" with shell = true: the prompt, read on the host, reaches
    the script as $HERDER_P_PROMPT; its text (here shell syntax) is never parsed."""
    (tmp_path / "repo").mkdir()
    origin = make_repository(tmp_path / "repo", prompt="$(touch pwned) `touch pwned` #{issue}\n")
    (tmp_path / "types").mkdir()
    config = load_config(write_config(tmp_path / "types", """
[job_types.fix]
shell = true
command = "printf '%s' {prompt} > said.txt"
prompt_file = "prompts/task.md"
prompt_from = "workspace"
workspace = { repository = "REPO", ref = "main", mode = "clone" }
""".replace("REPO", str(origin))))
    spec = resolve(config, SubmitRequest(job_type="fix", payload={"issue": 42}))
    assert spec.command[2] == """printf '%s' "${HERDER_P_PROMPT}" > said.txt"""
    workspace = of_env(spec.env)
    assert workspace is not None and workspace.prompt_parts == ()
    folder = tmp_path / "w" / "attempts" / "1.1"
    prepare(workspace, tmp_path / "w", folder, 0.0)
    env = {"HERDER_PAYLOAD": json.dumps({"issue": 42}), "PATH": os.defpath}
    argv = fill_command(list(spec.command), workspace, True, folder, env)
    subprocess.run(argv, cwd=folder, env=env, check=True, timeout=30)
    assert (folder / "said.txt").read_text() == "$(touch pwned) `touch pwned` #42\n"
    assert not (folder / "pwned").exists()
