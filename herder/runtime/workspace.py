"""Each attempt's fresh git checkout: prepared inside the attempt, removed or kept after it.

A job whose spec holds a workspace (herder.workspace) does not start its command directly:
the runner starts `python -m herder.runtime.workspace`, which checks the disk, checks out
the ref (a worktree of a mirror cached under the workspace root, or a shallow clone),
fills the prompt from the checkout, and then execs the job's command in the checkout. So
the git work is supervised like the job itself (heartbeats, timeout, cancel, kill) and its
output lands in the job's log. The job's environment reaches it on stdin, never on disk;
git runs with the host's environment (herder's own variables removed), never the job's.

A failure to prepare ends the attempt as `workspace_failed` ($HERDER_RESULT, and exit 6
under seed 004's exit codes) with git's message in the log. The runner removes the folder
when the attempt succeeded and keeps it `keep_failed` seconds otherwise (`sweep`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from herder.errors import InputError
from herder.hardening import child_environment
from herder.model import AttemptToken, Job
from herder.runtime.process import process_alive
from herder.templates import fill_prompt, render
from herder.workspace import WorkspaceSpec, of_env

EXIT_WORKSPACE_FAILED = 6
"""Seed 004's exit code for a workspace that could not be prepared."""
EXIT_LAUNCH_FAILED = 127
GIT_PROTOCOLS = "file:git:http:https:ssh"
"""The transports git may use: no `ext::` (it runs a command), whatever the repository says."""
KEPT_SUFFIX = ".kept"
OWNER_SUFFIX = ".owner"
GB = 1024**3


class WorkspaceError(Exception):
    """The workspace could not be prepared; the message is git's (or the disk's) own."""


class Workspaces(msgspec.Struct, frozen=True):
    """Where and how a runner prepares workspaces (herder.toml's [runtime] workspace_*)."""

    root: Path
    keep_failed: float
    min_free_gb: float

    def folder(self, token: AttemptToken, marker: str) -> Path:
        """One attempt's checkout; the marker's digest keeps two runners (two databases
        that reuse job ids) out of each other's folders."""
        digest = hashlib.sha256(marker.encode()).hexdigest()[:10]
        return self.root / "attempts" / f"{token.job_id}.{token.attempt}-{digest}"


class Launch(msgspec.Struct, frozen=True):
    """How the runner starts an attempt with a workspace: the preparing process, its
    environment (the host's, for git) and what it reads on stdin (the job's)."""

    argv: list[str]
    env: dict[str, str]
    stdin: bytes
    folder: Path


def spec_of(job: Job) -> WorkspaceSpec | None:
    return of_env(job.env)


def launch(job: Job, spec: WorkspaceSpec, job_env: Mapping[str, str], marker_variable: str,
           marker: str, workspaces: Workspaces,
           runner_environment: Mapping[str, str] | None = None) -> Launch:
    """The preparing process of one attempt (see the module's docstring)."""
    folder = workspaces.folder(job.token, marker)
    request = {"argv": list(job.command), "env": dict(job_env), "shell": job.shell,
               "spec": spec.encode(), "root": str(workspaces.root), "folder": str(folder),
               "min_free_gb": workspaces.min_free_gb}
    env = git_environment(os.environ if runner_environment is None else runner_environment)
    env[marker_variable] = marker
    # -P: the workspace root, its cwd, must not come first on the module path.
    return Launch([sys.executable, "-P", "-m", "herder.runtime.workspace"], env,
                  json.dumps(request).encode(), folder)


def git_environment(source: Mapping[str, str]) -> dict[str, str]:
    """The host's environment for git (its HOME, SSH agent, credential helpers), without
    herder's own variables (database URL, tokens); git never prompts, nor waits on a
    stalled transfer."""
    env = child_environment(source)
    env.update({"GIT_TERMINAL_PROMPT": "0", "GIT_ALLOW_PROTOCOL": GIT_PROTOCOLS,
                "LC_ALL": "C"})
    # A stalled HTTP transfer fails instead of hanging the attempt (unless the host says).
    env.setdefault("GIT_HTTP_LOW_SPEED_LIMIT", "1000")
    env.setdefault("GIT_HTTP_LOW_SPEED_TIME", "60")
    return env


# -- preparing (inside the attempt) ------------------------------------------------------------


def prepare(spec: WorkspaceSpec, root: Path, folder: Path, min_free_gb: float) -> str:
    """Check out `spec` into `folder`; the commit it is at. WorkspaceError says why not."""
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if free < min_free_gb * GB:
        raise WorkspaceError(f"only {free / GB:.2f} GB free under {root}; "
                             f"runtime.workspace_min_free_gb is {min_free_gb:g}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    if spec.mode == "worktree":
        mirror = root / "mirrors" / f"{_digest(spec.repository)}.git"
        with _locked(mirror.with_suffix(".lock")):
            _refresh(mirror, spec.repository)
            git("-C", str(mirror), "worktree", "prune")
            git("-C", str(mirror), "worktree", "add", "--detach", "--quiet", str(folder),
                spec.ref)
    else:
        folder.mkdir()
        git("init", "--quiet", str(folder))
        git("-C", str(folder), "remote", "add", "origin", spec.repository)
        git("-C", str(folder), "fetch", "--depth", "1", "--quiet", "origin", spec.ref)
        git("-C", str(folder), "checkout", "--quiet", "--detach", "FETCH_HEAD")
    return git("-C", str(folder), "rev-parse", "HEAD").strip()


def _refresh(mirror: Path, repository: str) -> None:
    """The host's mirror of `repository`, cloned once and fetched before each checkout."""
    if (mirror / "HEAD").exists():
        git("-C", str(mirror), "fetch", "--prune", "--quiet", "origin")
        return
    partial = mirror.with_name(f"{mirror.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    git("clone", "--mirror", "--quiet", repository, str(partial))
    partial.rename(mirror)


def git(*args: str) -> str:
    """Run git (no payload value is ever an option: herder.workspace refuses a leading
    '-'); its stdout, or WorkspaceError with its stderr."""
    try:
        done = subprocess.run(["git", *args], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, errors="replace", check=False)
    except OSError as exc:
        raise WorkspaceError(f"cannot run git: {exc}") from exc
    if done.returncode != 0:
        message = (done.stderr.strip() or done.stdout.strip())[-4000:]
        raise WorkspaceError(f"git {args[2] if args[0] == '-C' else args[0]} failed "
                             f"(exit {done.returncode}): {message}")
    return done.stdout


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One attempt at a time fetches a mirror and adds its worktree (on this host)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fill_command(argv: Sequence[str], spec: WorkspaceSpec, shell: bool, folder: Path,
                 env: Mapping[str, str]) -> list[str]:
    """The job's argv with the prompt read from the checkout, filled from the payload
    (InputError when a field is missing, WorkspaceError when the file cannot be read)."""
    if spec.prompt_file is None:
        return list(argv)
    path = (folder / spec.prompt_file).resolve()
    if not path.is_relative_to(folder.resolve()):  # a symlink out of the checkout
        raise WorkspaceError(f"prompt_file {spec.prompt_file} leads out of the checkout")
    try:
        template = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkspaceError(f"cannot read prompt_file {spec.prompt_file} in the checkout: "
                             f"{exc}") from exc
    context: dict[str, Any] = dict(json.loads(env.get("HERDER_PAYLOAD", "{}")))
    context["job_type"] = env.get("HERDER_JOB_TYPE", "")
    values = {"prompt": fill_prompt(template, context, "prompt_file"), "prompt_file": str(path)}
    if shell:
        values = {name: shlex.quote(value) for name, value in values.items()}
    filled = list(argv)
    for index in spec.prompt_parts:
        filled[index] = render(filled[index], values, "command")
    return filled


def run(request: Mapping[str, Any]) -> int:
    """The preparing process: prepare, then exec the job's command in the checkout; the
    exit status when it cannot get that far."""
    env: dict[str, str] = dict(request["env"])
    folder = Path(request["folder"])
    spec = WorkspaceSpec.decode(request["spec"])
    try:
        commit = prepare(spec, Path(request["root"]), folder, float(request["min_free_gb"]))
        argv = fill_command(request["argv"], spec, bool(request["shell"]), folder, env)
    except WorkspaceError as exc:
        say(f"workspace failed: {exc}")
        _result(env, {"outcome": "workspace_failed", "summary": str(exc)[:4000]})
        return EXIT_WORKSPACE_FAILED
    except InputError as exc:
        say(f"prompt failed: {exc}")
        _result(env, {"outcome": "failed", "failure_reason": "prompt_template",
                      "summary": str(exc)[:4000]})
        return 1
    say(f"workspace {folder} ({spec.mode} of {spec.repository} at {spec.ref}: {commit})")
    try:
        os.chdir(folder)
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        say(f"launch failed: {exc}")
    return EXIT_LAUNCH_FAILED


def say(line: str) -> None:
    """A line in the job's log (stdout is the log)."""
    sys.stdout.write(f"# herder: {line}\n")
    sys.stdout.flush()


def _result(env: Mapping[str, str], result: Mapping[str, Any]) -> None:
    path = env.get("HERDER_RESULT")
    if path:
        with contextlib.suppress(OSError):
            Path(path).write_text(json.dumps(result))


# -- after the attempt (the runner) ------------------------------------------------------------


def claim(folder: Path, worker: str) -> None:
    """Note beside the attempt's folder which runner owns it (`host/pid/start`), so a
    sweep can tell a folder whose runner died from one still in use."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.with_name(folder.name + OWNER_SUFFIX).write_text(worker + "\n")


def release(folder: Path, succeeded: bool, keep_failed: float, now: float) -> str | None:
    """Remove a succeeded attempt's checkout; keep a failed one until `now + keep_failed`
    (a `.kept` file beside it says until when). What to log, or None."""
    folder.with_name(folder.name + OWNER_SUFFIX).unlink(missing_ok=True)
    if not folder.exists():
        return None
    if succeeded or keep_failed <= 0:
        _remove(folder)
        return None
    marker = folder.with_name(folder.name + KEPT_SUFFIX)
    try:
        marker.write_text(f"{now + keep_failed:.0f}\n")
    except OSError as exc:  # a full disk: better gone than kept forever
        _remove(folder)
        return f"workspace removed, it could not be kept ({exc}): {folder}"
    return f"workspace kept for inspection for {keep_failed:g}s: {folder}"


def runner_alive(worker: str) -> bool:
    """Whether the runner `host/pid/start` still runs on this machine."""
    parts = worker.rsplit("/", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return False
    return process_alive(int(parts[1]), int(parts[2]))


def sweep(root: Path, now: float, keep_failed: float,
          alive: Callable[[str], bool] = runner_alive) -> int:
    """Remove kept checkouts whose time is up, and keep for inspection those whose runner
    died before it could release them; how many were removed."""
    attempts = root / "attempts"
    for owner in sorted(attempts.glob(f"*{OWNER_SUFFIX}")):
        with contextlib.suppress(OSError):
            if not alive(owner.read_text().strip()):
                release(owner.with_name(owner.name[: -len(OWNER_SUFFIX)]), False,
                        keep_failed, now)
    removed = 0
    for marker in sorted(attempts.glob(f"*{KEPT_SUFFIX}")):
        try:
            until = float(marker.read_text().strip() or 0)
        except (OSError, ValueError):
            until = 0.0
        if now < until:
            continue
        _remove(marker.with_name(marker.name[: -len(KEPT_SUFFIX)]))
        marker.unlink(missing_ok=True)
        removed += 1
    return removed


def _remove(folder: Path) -> None:
    """A worktree's entry in its mirror goes at the mirror's next `worktree prune`."""
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    _request = json.load(sys.stdin)
    with open(os.devnull, "rb") as _null:
        os.dup2(_null.fileno(), 0)
    sys.exit(run(_request))
