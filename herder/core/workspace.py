"""A job's workspace as submitted: which repository and ref to check out, how, and where
the prompt comes from. Pure values and checks; herder.runtime.workspace does the git work.

The spec travels with the job inside its env, under `HERDER_WORKSPACE` (JSON): stored in
the job's spec, sent to agents in their assignment and seen by the job itself, without a
column or a wire field of its own.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import msgspec
from msgspec.structs import asdict

from herder.core.errors import InputError

VARIABLE = "HERDER_WORKSPACE"
"""The job's env entry that holds its workspace spec."""
WORKDIR_BASE = "HERDER_WORKDIR_BASE"
"""The job's env entry that holds its templated workdir's base, checked again on the host."""
MODES = ("worktree", "clone")
PROMPT_SOURCES = ("submit", "workspace")
MAX_LENGTH = 2000
_USERINFO_SECRET = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*://[^/@]*:[^/@]*@|https?://[^/@]+@)",
                              re.IGNORECASE)
"""A password in a URL, or any user in an HTTP URL (a token passed as the user name): a leak
at rest, the credential stored with the job and shown in its log."""
_LOCATION = re.compile(r"^(/|[A-Za-z][A-Za-z0-9+.-]*://|[^/:]+:)")
"""An absolute path, a URL or scp-like `host:path`: a relative path would be relative to
wherever the host happens to run git."""
_UNSAFE_REF = re.compile(r"[\s\x00-\x1f\x7f:]|\.\.|@\{")
_TRANSPORT = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*::")
"""git's `<transport>::<address>` syntax (`ext::sh -c ...` runs a command, `fd::` reads
a descriptor): never from a workspace, whatever GIT_ALLOW_PROTOCOL says."""
_SCP_LIKE = re.compile(r"^(?:([^@/:]+)@)?([^/:]+):(.*)$")
_DEFAULT_PORTS = {"http": 80, "https": 443, "ssh": 22, "git": 9418}


class WorkspaceSpec(msgspec.Struct, frozen=True):
    """What a host checks out for each attempt of a job. `prompt_file` (relative to the
    checkout) is read and filled on the host; `prompt_parts` are the argv items that
    still hold `{prompt}` or `{prompt_file}` until then."""

    repository: str
    ref: str
    mode: str = "worktree"
    prompt_file: str | None = None
    prompt_parts: tuple[int, ...] = ()

    def encode(self) -> str:
        values: dict[str, Any] = {key: value for key, value in asdict(self).items()
                                  if value not in (None, ())}
        values["prompt_parts"] = list(self.prompt_parts)
        return json.dumps(values, sort_keys=True)

    @classmethod
    def decode(cls, text: str) -> WorkspaceSpec:
        """ValueError when the text is not a spec this herder wrote."""
        try:
            values = json.loads(text)
            spec = cls(repository=values["repository"], ref=values["ref"],
                       mode=values.get("mode", "worktree"),
                       prompt_file=values.get("prompt_file"),
                       prompt_parts=tuple(int(i) for i in values.get("prompt_parts", ())))
        except (TypeError, KeyError, ValueError, AttributeError) as exc:
            raise ValueError(f"{VARIABLE} is not a workspace spec: {exc}") from None
        problem = spec.problem()
        if problem is not None:
            raise ValueError(f"{VARIABLE}: {problem[0]} {problem[1]}")
        return spec

    def problem(self) -> tuple[str, str] | None:
        """(field, why) when a value could reach git as an option or carry a secret."""
        if self.mode not in MODES:
            return "mode", f"{self.mode!r} is not one of {', '.join(MODES)}"
        for name, value in (("repository", self.repository), ("ref", self.ref)):
            if not value.strip():
                return name, "is empty"
            if value.startswith("-"):
                return name, f"{value!r} starts with '-' (git would read it as an option)"
            if len(value) > MAX_LENGTH or "\x00" in value:
                return name, "is too long or holds a NUL"
        if _TRANSPORT.match(self.repository) or "\\" in self.repository:
            return "repository", (f"{self.repository!r} names a git transport helper or holds "
                                  "a backslash; give a URL, host:path or path")
        if _UNSAFE_REF.search(self.ref):
            return "ref", f"{self.ref!r} is not a branch, tag or commit name"
        if not _LOCATION.match(self.repository):
            return "repository", (f"{self.repository!r} is neither a URL, an scp-like "
                                  "host:path nor an absolute path")
        if _USERINFO_SECRET.match(self.repository):
            return "repository", ("holds a credential; git runs with the host's credentials "
                                  "(its credential helper or SSH keys), never the job's")
        if self.prompt_file is not None and not relative_inside(self.prompt_file):
            return "prompt_file", f"{self.prompt_file!r} must be a path inside the checkout"
        return None


class Location(msgspec.Struct, frozen=True):
    """A repository URL reduced to what decides where git goes: `local` for a path or
    file:// URL (then host and user are empty), and the path as segments."""

    scheme: str
    user: str
    host: str
    port: int | None
    segments: tuple[str, ...]

    @property
    def local(self) -> bool:
        return self.scheme == "file"


def location(repository: str) -> Location:
    """ValueError when the repository cannot be compared safely: a dot segment, an empty
    one, a percent-escape that changes a segment, a password."""
    if repository.startswith("/"):
        scheme, user, host, port, path = "file", "", "", None, repository
    elif "://" in repository:
        parts = urlsplit(repository)
        if parts.password is not None or parts.query or parts.fragment:
            raise ValueError("holds a password, a query or a fragment")
        try:
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"has a bad port: {exc}") from None
        scheme, user = parts.scheme.lower(), parts.username or ""
        host, path = (parts.hostname or "").lower(), parts.path
        if scheme != "file" and not host:
            raise ValueError("names no host")
        port = None if port == _DEFAULT_PORTS.get(scheme) else port
    else:
        match = _SCP_LIKE.match(repository)
        if match is None:
            raise ValueError("is neither a URL, host:path nor an absolute path")
        scheme, user, host, port = "ssh", match.group(1) or "", match.group(2).lower(), None
        path = "/" + match.group(3)
    if "%" in host or "@" in host:
        raise ValueError("has an escaped or doubled host")
    raw = path.strip("/").split("/") if path.strip("/") else []
    segments = tuple(unquote(segment) for segment in raw)
    if any(segment in ("", ".", "..") or "/" in segment for segment in segments):
        raise ValueError("has an empty, '.', '..' or escaped '/' path segment")
    if posixpath.normpath("/" + "/".join(segments)) != "/" + "/".join(segments):
        raise ValueError("is not a normal path")
    return Location(scheme, user, host, port, segments)


def prefix_problem(prefix: str) -> str | None:
    """Why a `repositories` entry cannot be a prefix, or None."""
    try:
        location(prefix)
    except ValueError as exc:
        return f"{prefix!r} {exc}; use e.g. \"https://github.com/acme/\""
    return None


def repository_refusal(repository: str, prefixes: Sequence[str] | None,
                       allow_local: bool, templated: bool) -> str | None:
    """Why a rendered repository may not be checked out for this job type, or None: a
    local path or file:// URL filled from the payload (unless allowed), one outside
    every prefix. Compared as locations, so `https://github.com/acme/../evil` and
    `https://github.com@evil.example/` match nothing but themselves."""
    try:
        where = location(repository)
    except ValueError as exc:
        return f"{repository!r} {exc}"
    if where.local and templated and not allow_local:
        return (f"{repository!r} is a local path or file:// URL; the job type must set "
                "allow_local_repositories = true to take one from the payload")
    if prefixes is None:
        return None
    for prefix in prefixes:
        allowed = location(prefix)
        if (allowed.scheme, allowed.user or where.user, allowed.host, allowed.port) == (
                where.scheme, where.user, where.host, where.port) and \
                where.segments[:len(allowed.segments)] == allowed.segments:
            return None
    return (f"{repository!r} is not under any of the job type's repositories "
            f"({', '.join(prefixes)})")


def workdir_inside(base: str, rendered: str) -> str:
    """A templated workdir as a normal absolute path under `base` (a relative one is taken
    under it); ValueError when it leads out (`..`, an absolute path elsewhere)."""
    path = posixpath.normpath(posixpath.join(base, rendered))
    root = posixpath.normpath(base)
    if "\x00" in rendered or (path != root and not path.startswith(root.rstrip("/") + "/")):
        raise ValueError(f"{rendered!r} leads out of {root}")
    return path


def resolved_inside(base: str, workdir: str) -> None:
    """On the machine that runs the job: the workdir with its symlinks resolved is still
    under the base with its own resolved (a link inside the base that points out is not);
    ValueError says where it leads."""
    real_base, real = os.path.realpath(base), os.path.realpath(workdir)
    if real != real_base and not real.startswith(real_base.rstrip("/") + "/"):
        raise ValueError(f"workdir {workdir} leads out of workdir_base {base} (to {real}, "
                         "through a symbolic link)")


def relative_inside(path: str) -> bool:
    """A relative path that does not climb out of the folder it is read from."""
    parts = path.replace("\\", "/").split("/")
    return bool(path) and not path.startswith(("/", "~")) and ".." not in parts


def checked(spec: WorkspaceSpec, where: str) -> WorkspaceSpec:
    """The spec, or an input error naming the field that git must not see."""
    problem = spec.problem()
    if problem is not None:
        raise InputError(f"{where}.{problem[0]}", problem[1],
                         "pass a repository URL or path and a branch, tag or commit")
    return spec


def of_env(env: Mapping[str, str]) -> WorkspaceSpec | None:
    """The job's workspace spec, or None for a job without one."""
    text = env.get(VARIABLE)
    return None if text is None else WorkspaceSpec.decode(text)
