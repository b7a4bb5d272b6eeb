"""Which environment variables a submitter may set on a job: the deny-list that holds for
every submit (whatever the token, CLI, Python or HTTP) and a job type's `submit_env`
allow-list for restricted tokens.

A job type with a fixed argv is still a program whose behaviour its environment changes:
a loader or interpreter variable runs code in it (LD_PRELOAD, BASH_ENV, NODE_OPTIONS,
PERL5OPT, GIT_CONFIG_* with core.fsmonitor), an endpoint or proxy variable sends the bound
account's key to whoever the submitter names (ANTHROPIC_BASE_URL, HTTPS_PROXY), a CA
variable lets that party read the traffic. The job type's own `env` in herder.toml is the
operator's and is not checked here. Names are compared without regard to case (curl and
npm read lower-case `http_proxy` and `npm_config_*` too).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from herder.core.errors import InputError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

RUNS_CODE = "loads or runs code in the job's programs"
REDIRECTS = "sends the job's traffic (and the account's key) where the submitter says"
TRUSTS = "makes the job trust certificates the submitter chose"
SHELL = "changes how the job's shell runs commands"
OWN = "belongs to herder or the job's own identity"
CONFIG = "points the job's tools at configuration the submitter chose"

DENIED: tuple[tuple[str, str], ...] = (
    # the dynamic loader and libc
    ("LD_*", RUNS_CODE), ("DYLD_*", RUNS_CODE), ("GLIBC_TUNABLES", RUNS_CODE),
    ("GCONV_PATH", RUNS_CODE), ("GETCONF_DIR", RUNS_CODE), ("LOCPATH", RUNS_CODE),
    ("NLSPATH", RUNS_CODE), ("MALLOC_TRACE", RUNS_CODE), ("HOSTALIASES", REDIRECTS),
    ("RESOLV_HOST_CONF", REDIRECTS), ("LOCALDOMAIN", REDIRECTS), ("RES_OPTIONS", REDIRECTS),
    # shells
    ("BASH_ENV", RUNS_CODE), ("ENV", RUNS_CODE), ("BASH_FUNC_*", RUNS_CODE),
    ("PROMPT_COMMAND", RUNS_CODE), ("PS4", RUNS_CODE), ("SHELLOPTS", SHELL),
    ("BASHOPTS", SHELL), ("IFS", SHELL), ("CDPATH", SHELL), ("GLOBIGNORE", SHELL),
    ("SHELL", SHELL), ("PATH", RUNS_CODE),
    # interpreters and runtimes
    ("NODE_OPTIONS", RUNS_CODE), ("NODE_PATH", RUNS_CODE), ("NODE_TLS_*", TRUSTS),
    ("NODE_EXTRA_CA_CERTS", TRUSTS), ("ELECTRON_RUN_AS_NODE", RUNS_CODE),
    ("NPM_CONFIG_*", CONFIG), ("PYTHON*", RUNS_CODE), ("PERL5*", RUNS_CODE),
    ("PERLLIB", RUNS_CODE), ("PERL_*", RUNS_CODE), ("RUBYOPT", RUNS_CODE),
    ("RUBYLIB", RUNS_CODE), ("LUA_INIT*", RUNS_CODE), ("LUA_PATH*", RUNS_CODE),
    ("LUA_CPATH*", RUNS_CODE), ("PHPRC", RUNS_CODE), ("PHP_INI_SCAN_DIR", RUNS_CODE),
    ("JAVA_TOOL_OPTIONS", RUNS_CODE), ("_JAVA_OPTIONS", RUNS_CODE),
    ("JDK_JAVA_OPTIONS", RUNS_CODE), ("OPENSSL_*", RUNS_CODE), ("ZDOTDIR", RUNS_CODE),
    # toolchains and builds: Go, Rust, C, make (not a bare GO*: GOOGLE_API_KEY is a key)
    ("GOFLAGS", RUNS_CODE), ("GOPROXY", REDIRECTS), ("GONOPROXY", REDIRECTS),
    ("GOTOOLCHAIN", RUNS_CODE), ("GONOSUMDB", TRUSTS), ("GONOSUMCHECK", TRUSTS),
    ("GOPRIVATE", TRUSTS), ("GOINSECURE", TRUSTS), ("GOSUMDB", TRUSTS),
    ("GOAUTH", RUNS_CODE), ("GOVCS", CONFIG), ("GOENV", CONFIG), ("GOROOT", RUNS_CODE),
    ("GOPATH", RUNS_CODE), ("GOBIN", RUNS_CODE), ("GOEXPERIMENT", CONFIG),
    ("GOCACHE", RUNS_CODE), ("GOMODCACHE", RUNS_CODE), ("CGO_*", RUNS_CODE),
    ("CARGO", RUNS_CODE), ("CARGO_*", RUNS_CODE), ("RUSTC", RUNS_CODE), ("RUSTC_*", RUNS_CODE),
    ("RUSTDOC", RUNS_CODE), ("RUSTFLAGS", RUNS_CODE), ("RUSTDOCFLAGS", RUNS_CODE),
    ("RUSTUP_*", RUNS_CODE), ("CC", RUNS_CODE), ("CXX", RUNS_CODE), ("CPP", RUNS_CODE),
    ("LD", RUNS_CODE), ("AR", RUNS_CODE), ("CFLAGS", RUNS_CODE), ("CXXFLAGS", RUNS_CODE),
    ("CPPFLAGS", RUNS_CODE), ("LDFLAGS", RUNS_CODE), ("MAKEFLAGS", RUNS_CODE),
    ("MFLAGS", RUNS_CODE), ("MAKEFILES", RUNS_CODE), ("CMAKE_*", RUNS_CODE),
    # package managers: their hooks, indexes and registries
    ("UV_*", CONFIG), ("PIP_*", CONFIG), ("PIPX_*", CONFIG), ("POETRY_*", CONFIG),
    ("YARN_*", CONFIG), ("BUN_*", CONFIG), ("DENO_*", CONFIG),
    # the agent CLIs' own switches (Claude Code's provider, endpoints and permissions)
    ("CLAUDE_CODE_*", CONFIG),
    # programs that other programs start
    ("GIT_*", RUNS_CODE), ("*_ASKPASS", RUNS_CODE), ("EDITOR", RUNS_CODE),
    ("VISUAL", RUNS_CODE), ("PAGER", RUNS_CODE), ("MANPAGER", RUNS_CODE),
    ("LESSOPEN", RUNS_CODE), ("LESSCLOSE", RUNS_CODE), ("BROWSER", RUNS_CODE),
    ("SSH_*", RUNS_CODE),
    # where traffic goes, and whom it trusts
    ("*_PROXY", REDIRECTS), ("*_BASE_URL", REDIRECTS), ("*_API_BASE", REDIRECTS),
    ("*_API_URL", REDIRECTS), ("*_ENDPOINT", REDIRECTS), ("*_ENDPOINT_URL", REDIRECTS),
    ("*_INDEX_URL", REDIRECTS), ("AWS_ENDPOINT_URL*", REDIRECTS), ("GH_HOST", REDIRECTS),
    ("DOCKER_HOST", REDIRECTS), ("KUBECONFIG", CONFIG),
    ("SSL_CERT_*", TRUSTS), ("*_CA_BUNDLE", TRUSTS), ("CURL_HOME", CONFIG),
    ("WGETRC", CONFIG),
    # whose files and configuration the job uses
    ("HOME", CONFIG), ("XDG_*", CONFIG), ("TMPDIR", CONFIG), ("CLAUDE_CONFIG_DIR", CONFIG),
    ("CODEX_HOME", CONFIG), ("HERDER_*", OWN), ("USER", OWN), ("LOGNAME", OWN),
)
"""(pattern, why): a pattern is a name, `PREFIX*` or `*SUFFIX`, compared in upper case."""


def matches(name: str, pattern: str) -> bool:
    """Whether `name` matches a `NAME`, `PREFIX*` or `*SUFFIX` pattern (case-insensitive)."""
    name, pattern = name.upper(), pattern.upper()
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1])
    if pattern.startswith("*"):
        return name.endswith(pattern[1:])
    return name == pattern


def env_refusal(name: str) -> str | None:
    """Why a submitter may not set `name` on any job, or None."""
    if not _ENV_NAME.match(name):
        return f"{name!r} is not a variable name (letters, digits and _, not first a digit)"
    for pattern, why in DENIED:
        if matches(name, pattern):
            shown = "" if pattern.upper() == name.upper() else f" (matches {pattern})"
            return f"{name}{shown} {why}: no submitter may set it"
    return None


def check_submitted_env(env: Mapping[str, str]) -> None:
    """InputError (422) naming the first variable of a submit's `env` that no one may set."""
    for name in env:
        refusal = env_refusal(name)
        if refusal is not None:
            raise InputError(f"env.{name}", refusal,
                             "leave it out; an operator may set it in the job type's env "
                             "in herder.toml")


def allowed(name: str, allow_list: Iterable[str]) -> bool:
    """Whether a job type's `submit_env` (names or `PREFIX*`) lets a submitter set `name`."""
    return any(matches(name, entry) for entry in allow_list)


def allow_entry_refusal(entry: str) -> str | None:
    """Why a `submit_env` entry is refused at load: not a name or `PREFIX*`, or it admits
    only denied names (the deny-list still applies to what a `PREFIX*` entry admits)."""
    prefix = entry[:-1] if entry.endswith("*") else None
    name = entry if prefix is None else prefix
    if not _ENV_NAME.match(name):
        return f"{entry!r} is not a variable name or a PREFIX* pattern, e.g. \"MY_FLAG\""
    if prefix is None:
        refusal = env_refusal(entry)
        return None if refusal is None else f"{refusal}; remove it from submit_env"
    for pattern, why in DENIED:
        if pattern.endswith("*") and prefix.upper().startswith(pattern[:-1]):
            return f"{entry!r} admits only {pattern}, which {why}; remove it from submit_env"
    return None
