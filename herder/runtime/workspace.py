"""Each attempt's fresh git checkout: prepared inside the attempt, removed or kept after it.

A job whose spec holds a workspace (herder.core.workspace) does not start its command directly:
the runner starts `python -m herder.runtime.workspace`, which checks the disk, checks out
the ref (a shared clone of a mirror cached under the workspace root, or a shallow clone),
fills the prompt from the checkout, and then execs the job's command in the checkout. So
the git work is supervised like the job itself (heartbeats, timeout, cancel, kill) and its
output lands in the job's log. The job's environment reaches it on stdin, never on disk;
git runs with the host's environment (herder's own variables removed), never the job's.

A failure to prepare ends the attempt as `workspace_failed` ($HERDER_RESULT, and exit 6
under the launch wrapper's exit codes) with git's message in the log. The runner removes the folder
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

from herder.core.errors import InputError
from herder.core.model import AttemptToken, Job
from herder.core.shell_templates import variable
from herder.core.templates import fill_prompt, render
from herder.core.workspace import WORKDIR_BASE, WorkspaceSpec, of_env, resolved_inside
from herder.runtime.hardening import child_environment
from herder.runtime.job_user import JobUser
from herder.runtime.process import process_alive

EXIT_WORKSPACE_FAILED = 6
"""The launch wrapper's exit code for a workspace that could not be prepared
(`herder.core.scheduling.classification.SEED_EXIT_CODES`)."""
EXIT_LAUNCH_FAILED = 127
GIT_PROTOCOLS = "file:git:http:https:ssh"
"""The transports git may use: no `ext::` (it runs a command), whatever the repository says."""
SAFE_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.hooksPath", "/dev/null"), ("core.fsmonitor", "false"), ("core.sshCommand", "ssh"),
    ("core.askPass", ""), ("core.pager", "cat"), ("core.attributesFile", "/dev/null"),
)
"""`-c` values on every git command herder runs on a mirror or a checkout: they outrank
every config file (and what a file includes), so nothing a job writes into the mirror
it shares with later attempts runs a hook, an fsmonitor, a pager or an ssh of its own.
The host's ssh is `GIT_SSH_COMMAND` in the runner's environment."""
SAFE_ENVIRONMENT = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_NO_REPLACE_OBJECTS": "1",
                    "GIT_ATTR_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
                    "GIT_ALLOW_PROTOCOL": GIT_PROTOCOLS, "GIT_OPTIONAL_LOCKS": "0"}
"""git's environment on top of the host's: no system config, no replace refs (a job's
`refs/replace/` would swap what the next checkout reads), only plain transports; the
global config is /dev/null unless the runner's environment names one (GIT_CONFIG_GLOBAL,
a file jobs cannot write) for the host's credential helper."""
PLANTABLE = ("info/attributes", "info/grafts", "objects/info/alternates", "shallow",
             "config.worktree")
"""Files of a mirror that change what git runs or reads and that herder never writes: a
job sharing the mirror could plant them, so each preparation removes them."""
KEPT_SUFFIX = ".kept"
OWNER_SUFFIX = ".owner"
RUNS = "runs"
TRAVERSE_ONLY = 0o711
"""herder's folders on a run_as job's way to its own: passed through, never listed."""
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

    def run_folder(self, token: AttemptToken, marker: str) -> Path:
        """A run_as job's own folder (its $HERDER_RESULT), named as its checkout."""
        return self.root / RUNS / self.folder(token, marker).name


class Launch(msgspec.Struct, frozen=True):
    """How the runner starts an attempt with a workspace: the preparing process, its
    environment (the host's, for git) and what it reads on stdin (the job's)."""

    argv: list[str]
    env: dict[str, str]
    stdin: bytes
    folder: Path


def spec_of(job: Job) -> WorkspaceSpec | None:
    """The job's workspace spec; ValueError when the job cannot start here: a spec that
    was tampered with, or a templated workdir whose symlinks lead out of its base (the
    runner ends the attempt as a launch failure saying so)."""
    base = job.env.get(WORKDIR_BASE)
    if base is not None and job.workdir is not None:
        resolved_inside(base, job.workdir)
    return of_env(job.env)


def launch(job: Job, spec: WorkspaceSpec, job_env: Mapping[str, str], marker_variable: str,
           marker: str, workspaces: Workspaces,
           runner_environment: Mapping[str, str] | None = None,
           user: JobUser | None = None) -> Launch:
    """The preparing process of one attempt (see the module's docstring); under run_as
    (`user`) it hands the checkout over and becomes that user before the job starts."""
    folder = workspaces.folder(job.token, marker)
    request: dict[str, Any] = {
        "argv": list(job.command), "env": dict(job_env), "shell": job.shell,
        "spec": spec.encode(), "root": str(workspaces.root), "folder": str(folder),
        "min_free_gb": workspaces.min_free_gb}
    if user is not None:
        request["run_as"] = {"uid": user.uid, "gid": user.gid, "groups": list(user.groups)}
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
    env.update(SAFE_ENVIRONMENT)
    env["LC_ALL"] = "C"
    env.setdefault("GIT_CONFIG_GLOBAL", os.devnull)
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
            _sanitise(mirror, spec.repository)
            git("-C", str(mirror), "worktree", "prune")  # entries of herder < issue 23
            commit = _commit_of(mirror, spec.ref)
            # A clone that reads the mirror's objects (alternates) and owns everything else:
            # its config, hooks and index are the attempt's, so a tool that installs a hook
            # or sets a config in the checkout changes nothing of the next attempt's.
            git("clone", "--shared", "--no-checkout", "--quiet", str(mirror), str(folder))
        git("-C", str(folder), "remote", "set-url", "origin", spec.repository)
        git("-C", str(folder), "checkout", "--quiet", "--detach", commit)
    else:
        folder.mkdir()
        git("init", "--quiet", str(folder))
        git("-C", str(folder), "remote", "add", "origin", spec.repository)
        git("-C", str(folder), "fetch", "--depth", "1", "--quiet", "origin", spec.ref)
        git("-C", str(folder), "checkout", "--quiet", "--detach", "FETCH_HEAD")
    return git("-C", str(folder), "rev-parse", "HEAD").strip()


def _commit_of(mirror: Path, ref: str) -> str:
    """The commit a branch, tag or commit name is at in the mirror."""
    try:
        return git("-C", str(mirror), "rev-parse", "--verify", "--end-of-options",
                   f"{ref}^{{commit}}").strip()
    except WorkspaceError as exc:
        raise WorkspaceError(f"invalid reference: {ref} (no branch, tag or commit of that "
                             f"name in the repository): {exc}") from None


def _refresh(mirror: Path, repository: str) -> None:
    """The host's mirror of `repository`, cloned once and fetched before each checkout."""
    if (mirror / "HEAD").exists():
        _sanitise(mirror, repository)
        # The URL and refspec as herder knows them, not as the mirror's config says.
        git("-C", str(mirror), "fetch", "--prune", "--quiet", repository, MIRROR_REFSPEC)
        return
    partial = mirror.with_name(f"{mirror.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    git("clone", "--mirror", "--quiet", repository, str(partial))
    partial.rename(mirror)


MIRROR_REFSPEC = "+refs/*:refs/*"


def _sanitise(mirror: Path, repository: str) -> None:
    """The mirror's config back to what herder wrote, and files a job could have planted
    in it removed: the mirror is shared by every attempt on this host, and a job under
    herder's own user can find it and write into it (see docs/job-types.md, Workspaces)."""
    config = mirror / "config"
    object_format = "sha1"
    with contextlib.suppress(WorkspaceError):
        found = git("config", "--file", str(config), "extensions.objectformat").strip()
        object_format = "sha256" if found == "sha256" else "sha1"
    fresh = mirror / "config.herder"
    fresh.unlink(missing_ok=True)
    values = [("core.repositoryformatversion", "1" if object_format == "sha256" else "0"),
              ("core.bare", "true"), ("remote.origin.url", repository),
              ("remote.origin.fetch", MIRROR_REFSPEC), ("remote.origin.mirror", "true")]
    if object_format == "sha256":
        values.append(("extensions.objectformat", "sha256"))
    for key, value in values:
        git("config", "--file", str(fresh), key, value)
    os.replace(fresh, config)
    for name in PLANTABLE:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            (mirror / name).unlink()
    hooks = mirror / "hooks"
    with contextlib.suppress(OSError):
        if hooks.is_symlink():
            hooks.unlink()
        elif hooks.exists():
            shutil.rmtree(hooks)


def git(*args: str) -> str:
    """Run git with hooks, fsmonitor and every config a job could write defused (no
    payload value is ever an option: herder.core.workspace refuses a leading '-'); its stdout,
    or WorkspaceError with its stderr."""
    overrides = [item for key, value in SAFE_CONFIG for item in ("-c", f"{key}={value}")]
    env = dict(os.environ)
    env.update(SAFE_ENVIRONMENT)
    env.setdefault("GIT_CONFIG_GLOBAL", os.devnull)
    try:
        done = subprocess.run(["git", *overrides, *args], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, errors="replace", check=False,
                              env=env)
    except OSError as exc:
        raise WorkspaceError(f"cannot run git: {exc}") from exc
    if done.returncode != 0:
        message = (done.stderr.strip() or done.stdout.strip())[-4000:]
        raise WorkspaceError(f"git {args[2] if args[0] == '-C' else args[0]} failed "
                             f"(exit {done.returncode}): {message}")
    return done.stdout


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One attempt at a time fetches a mirror and clones it (on this host)."""
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
                 env: dict[str, str]) -> list[str]:
    """The job's argv with the prompt read from the checkout, filled from the payload
    (InputError when a field is missing, WorkspaceError when the file cannot be read). A
    shell script reads them from its env ($HERDER_P_PROMPT, herder.core.shell_templates)."""
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
        env.update({variable(name): value for name, value in values.items()})
        # A script rendered before values travelled in the env holds {prompt} itself.
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
        if request.get("run_as"):
            become(request["run_as"], folder)
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


def become(user: Mapping[str, Any], folder: Path) -> None:
    """Hand the prepared checkout to the run_as user, then become that user. The checkout
    is a repository of its own in both modes (worktree mode's borrows the mirror's objects
    read only), so the mirror stays herder's alone."""
    uid, gid = int(user["uid"]), int(user["gid"])
    try:
        _chown_tree(folder, uid, gid)
        os.setgroups([int(group) for group in user["groups"]])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    except OSError as exc:
        raise WorkspaceError(f"cannot hand the checkout to run_as uid {uid}: {exc}") from exc


def _chown_tree(top: Path, uid: int, gid: int) -> None:
    """Bottom up, links not followed: each folder changes hands only once what is inside
    it has, so nothing can be swapped for a link while herder still walks it."""
    for base, folders, files in os.walk(top, topdown=False):
        for name in (*files, *folders):
            os.lchown(os.path.join(base, name), uid, gid)
    os.lchown(top, uid, gid)


def open_to(root: Path) -> None:
    """The workspace root and its attempts' and runs' folders: herder's, which a run_as
    job passes through to its own folder but cannot list (other attempts' names)."""
    for folder in (root, root / "attempts", root / RUNS):
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, TRAVERSE_ONLY)


def _reclaim(folder: Path) -> None:
    """Take a handed-over checkout back from the run_as user: only its top folder,
    herder's and 0700, so no later job of that user reaches into it (a recursive chown
    could be led astray by a link)."""
    with contextlib.suppress(OSError):
        if folder.lstat().st_uid != os.geteuid():
            os.lchown(folder, os.geteuid(), os.getegid())
            os.chmod(folder, 0o700)


def _result(env: Mapping[str, str], result: Mapping[str, Any]) -> None:
    """The preparing process's own verdict. Under run_as it is still root here and the
    result's folder is the job user's, where another job of that user may have planted a
    link: the file is created new, never through a link, never over one that exists."""
    path = env.get("HERDER_RESULT")
    if not path:
        return
    with contextlib.suppress(OSError):
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(json.dumps(result))


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
    _reclaim(folder)
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
    for owner in sorted((root / RUNS).glob(f"*{OWNER_SUFFIX}")):  # run_as jobs' folders
        with contextlib.suppress(OSError):
            if not alive(owner.read_text().strip()):
                shutil.rmtree(owner.with_name(owner.name[: -len(OWNER_SUFFIX)]),
                              ignore_errors=True)
                owner.unlink()
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
    """The checkout is a folder of its own (it only reads the mirror's objects)."""
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    _request = json.load(sys.stdin)
    with open(os.devnull, "rb") as _null:
        os.dup2(_null.fileno(), 0)
    sys.exit(run(_request))
