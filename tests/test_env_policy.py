"""The env deny-list (herder.core.env_policy): one case per entry, in upper and lower case, plus
the `submit_env` allow-list and its checks at load."""

from __future__ import annotations

import pytest

from herder.core.env_policy import (
    DENIED,
    allow_entry_refusal,
    allowed,
    check_submitted_env,
    env_refusal,
    matches,
)
from herder.core.errors import ConfigError, InputError
from herder.core.settings.loading import load_config


def example(pattern: str) -> str:
    """A name the pattern matches: `LD_*` -> `LD_X`, `*_PROXY` -> `X_PROXY`."""
    return pattern.replace("*", "X")


@pytest.mark.parametrize(("pattern", "why"), DENIED, ids=[p for p, _ in DENIED])
def test_every_entry_refuses_its_names_in_any_case(pattern, why):
    for name in (example(pattern), example(pattern).lower()):
        refusal = env_refusal(name)
        assert refusal is not None, name
        assert refusal.startswith(name) and why in refusal
    with pytest.raises(InputError) as raised:
        check_submitted_env({"SAFE": "1", example(pattern): "x"})
    assert raised.value.field == f"env.{example(pattern)}"
    assert "herder.toml" in str(raised.value)


@pytest.mark.parametrize("name", [
    "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "BASH_ENV", "ENV", "NODE_OPTIONS",
    "PERL5OPT", "PERL5LIB", "PYTHONPATH", "PYTHONSTARTUP", "RUBYOPT", "GIT_CONFIG_COUNT",
    "GIT_CONFIG_KEY_0", "GIT_SSH_COMMAND", "GIT_ASKPASS", "HTTPS_PROXY", "https_proxy",
    "http_proxy", "ALL_PROXY", "NO_PROXY", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL",
    "OPENAI_API_BASE", "AWS_ENDPOINT_URL", "PIP_INDEX_URL", "NODE_TLS_REJECT_UNAUTHORIZED",
    "NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE", "DYLD_INSERT_LIBRARIES", "PROMPT_COMMAND", "SHELLOPTS", "BASHOPTS",
    "IFS", "PATH", "HOME", "XDG_CONFIG_HOME", "HERDER_DB", "HERDER_API_TOKEN",
    "HERDER_WORKSPACE", "CLAUDE_CONFIG_DIR", "GCONV_PATH", "GLIBC_TUNABLES",
    "JAVA_TOOL_OPTIONS", "OPENSSL_CONF", "SSH_ASKPASS", "npm_config_script_shell",
    "BASH_FUNC_ls%%", "", "1X", "A-B", "A=B",
    # toolchains, builds, package managers and agent CLIs (the review after issue 23)
    "GOFLAGS", "GOPROXY", "goproxy", "GOTOOLCHAIN", "GONOSUMDB", "GOPRIVATE", "GOINSECURE",
    "GOSUMDB", "GOENV", "GOROOT", "GOPATH", "GOEXPERIMENT", "GOCACHE", "GOAUTH",
    "CGO_CFLAGS", "CGO_LDFLAGS", "CARGO_HOME", "CARGO_BUILD_RUSTC_WRAPPER",
    "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER", "CARGO_REGISTRIES_CRATES_IO_PROTOCOL",
    "RUSTC", "RUSTC_WRAPPER", "RUSTC_BOOTSTRAP", "RUSTFLAGS", "RUSTDOCFLAGS",
    "RUSTUP_TOOLCHAIN", "RUSTUP_DIST_SERVER", "CC", "cc", "CXX", "CPP", "LD", "CFLAGS",
    "CXXFLAGS", "LDFLAGS", "CPPFLAGS", "MAKEFLAGS", "MFLAGS", "MAKEFILES",
    "CMAKE_C_COMPILER_LAUNCHER", "AWS_ENDPOINT_URL_S3", "UV_INDEX", "UV_PYTHON",
    "PIP_EXTRA_INDEX_URL", "PIP_CONFIG_FILE", "PIPX_HOME", "POETRY_REPOSITORIES_X_URL",
    "YARN_NPM_REGISTRY_SERVER", "BUN_CONFIG_REGISTRY", "DENO_CERT", "ZDOTDIR",
    "CLAUDE_CODE_USE_BEDROCK", "GH_HOST", "GITHUB_API_URL",
])
def test_the_attacks_the_issue_names_are_refused(name):
    assert env_refusal(name) is not None


@pytest.mark.parametrize("name", ["MY_FLAG", "CI", "TERM", "LANG", "DEBUG", "ISSUE_URL",
                                  "ANTHROPIC_MODEL", "RUST_LOG", "NODE_ENV", "TZ",
                                  # near the new entries, yet not them: a key is not a hook
                                  "GOOGLE_API_KEY", "GOOS", "GH_ENTERPRISE_TOKEN", "GH_TOKEN",
                                  "CCACHE_DISABLE", "LDAP_URI", "CARGOES", "RUST_BACKTRACE",
                                  "MAKE_TARGET", "ARCH"])
def test_ordinary_variables_pass(name):
    assert env_refusal(name) is None
    check_submitted_env({name: "value"})


def test_patterns_match_names_prefixes_and_suffixes_in_any_case():
    assert matches("ld_preload", "LD_*") and matches("Http_Proxy", "*_PROXY")
    assert matches("ENV", "ENV") and not matches("ENVIRONMENT", "ENV")
    assert not matches("PATHS", "PATH") and not matches("MY_PATH", "PATH")


def test_submit_env_allows_names_and_prefixes():
    assert allowed("MY_FLAG", ["MY_FLAG"]) and allowed("APP_MODE", ["APP_*"])
    assert not allowed("OTHER", ["MY_FLAG", "APP_*"]) and not allowed("X", [])


@pytest.mark.parametrize(("entry", "refused"), [
    ("MY_FLAG", False), ("APP_*", False), ("LD_PRELOAD", True), ("LD_*", True),
    ("GIT_CONFIG_*", True), ("HERDER_X*", True), ("*", True), ("1BAD", True),
    ("A-B", True), ("PATH", True),
])
def test_submit_env_entries_are_checked_at_load(entry, refused, tmp_path):
    assert (allow_entry_refusal(entry) is not None) == refused
    path = tmp_path / "herder.toml"
    path.write_text(f'[job_types.t]\ncommand = ["true"]\nsubmit_env = ["{entry}"]\n')
    if refused:
        with pytest.raises(ConfigError) as raised:
            load_config(path)
        assert "submit_env" in str(raised.value)
    else:
        assert load_config(path).settings.job_types["t"].submit_env == [entry]


@pytest.mark.parametrize(("key", "value"), [
    ("submit_max_weight", '"enormous"'), ("submit_max_timeout", "0"),
    ("submit_max_attempts", "0"), ("allow_host", "[1]")])
def test_the_submit_bounds_are_checked_at_load(key, value, tmp_path):
    path = tmp_path / "herder.toml"
    path.write_text(f'[job_types.t]\ncommand = ["true"]\n{key} = {value}\n')
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert key in str(raised.value)


def test_server_max_reservation_weight_must_be_a_weight(tmp_path):
    path = tmp_path / "herder.toml"
    path.write_text('[server]\nmax_reservation_weight = "enormous"\n')
    with pytest.raises(ConfigError, match="max_reservation_weight"):
        load_config(path)


def test_a_prefix_entry_still_admits_no_denied_name():
    """`submit_env = ["MY_*"]` lets MY_FLAG through; the deny-list holds for MY_X_PROXY."""
    assert allowed("MY_X_PROXY", ["MY_*"])
    assert env_refusal("MY_X_PROXY") is not None
