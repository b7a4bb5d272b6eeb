"""A job's workspace as submitted: which repository and ref to check out, how, and where
the prompt comes from. Pure values and checks; herder.runtime.workspace does the git work.

The spec travels with the job inside its env, under `HERDER_WORKSPACE` (JSON): stored in
the job's spec, sent to agents in their assignment and seen by the job itself, without a
column or a wire field of its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import msgspec
from msgspec.structs import asdict

from herder.errors import InputError

VARIABLE = "HERDER_WORKSPACE"
"""The job's env entry that holds its workspace spec."""
MODES = ("worktree", "clone")
PROMPT_SOURCES = ("submit", "workspace")
MAX_LENGTH = 2000
_USERINFO_SECRET = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*://[^/@]*:[^/@]*@|https?://[^/@]+@)",
                              re.IGNORECASE)
"""A password in a URL, or any user in an HTTP URL (a token passed as the user name): seed
000's at-rest leak, the credential stored with the job and shown in its log."""
_LOCATION = re.compile(r"^(/|[A-Za-z][A-Za-z0-9+.-]*://|[^/:]+:)")
"""An absolute path, a URL or scp-like `host:path`: a relative path would be relative to
wherever the host happens to run git."""
_UNSAFE_REF = re.compile(r"[\s\x00-\x1f\x7f:]|\.\.|@\{")


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
