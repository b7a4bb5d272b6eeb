"""What a job sees of its runner's environment: an allow-list, its own env and herder's job
identity, never one of herder's credentials (the jobs are AI agents run with every
permission; a token they could read would let them take other hosts' jobs).

Pure tests of `job_environment` and of the `[runtime] pass_env` check, then real
`herder up` and `herder agent` processes whose job prints its whole environment.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.cli import run_herder
from support.local import Harness, shell
from support.waits import wait_for

from herder.core.errors import ConfigError
from herder.core.model import Job, JobStatus
from herder.core.settings.loading import load_config
from herder.runtime.executor import job_environment
from herder.runtime.process import TOKEN_VARIABLE

SECRETS = {
    "HERDER_API_TOKEN": "hdr_api-secret-0123456789",
    "HERDER_AGENT_TOKEN": "hdr_agent-secret-0123456789",
    "HERDER_TOKEN_FILE": "/secret/agent-token",
    "HERDER_SERVER": "https://coordinator.invalid:8470",
    "HERDER_CONFIG": "/secret/herder.toml",
    "HERDER_DB": "postgresql://herder:db-password-42@db.invalid/herder",
}


def a_job(env: dict[str, str] | None = None) -> Job:
    from herder.runtime.agent import job_from_assignment

    stamp = datetime.now(UTC).isoformat()
    return job_from_assignment({
        "id": 7, "attempt": 2, "job_type": "adhoc", "command": ["true"], "shell": False,
        "payload": {"issue": 42}, "priority": 100, "weight": "light", "ram_gb": 3.0,
        "env": env or {}, "workdir": "/tmp", "timeout_seconds": None, "max_attempts": 3,
        "failures": 0, "lost": 0, "spawn_failures": 0, "backoff_base_seconds": 10.0,
        "backoff_max_seconds": 600.0, "available_at": stamp, "created_at": stamp,
        "updated_at": stamp,
    })


# -- pure -------------------------------------------------------------------------------------


def test_only_the_allow_list_of_the_runner_environment_passes():
    runner = {"PATH": "/usr/bin", "HOME": "/home/a", "USER": "a", "LANG": "C.UTF-8",
              "LC_ALL": "C", "LC_TIME": "C", "TZ": "UTC", "TERM": "xterm", "SHELL": "/bin/sh",
              "OPENAI_API_KEY": "sk-1", "AWS_REGION": "eu", "AWS_SECRET": "s", "PGPASSWORD": "p",
              "DATABASE_URL": "postgresql://u:p@h/d", **SECRETS}
    env = job_environment(a_job(), "bms-4", "7.2@bms-4/1/1", Path("/logs/7/2.log"),
                          runner_environment=runner)
    base = {"PATH", "HOME", "USER", "LANG", "LC_ALL", "LC_TIME", "TZ", "TERM", "SHELL"}
    identity = {"HERDER_JOB_ID", "HERDER_ATTEMPT", "HERDER_JOB_TYPE", "HERDER_WEIGHT",
                "HERDER_HOST", "HERDER_LOG", "HERDER_RESULT", "HERDER_PAYLOAD", TOKEN_VARIABLE}
    assert set(env) == base | identity
    assert (env["HERDER_JOB_ID"], env["HERDER_ATTEMPT"], env["HERDER_HOST"]) == ("7", "2",
                                                                                  "bms-4")

    extended = job_environment(a_job(), "bms-4", "m", Path("/l"), ("OPENAI_API_KEY", "AWS_*"),
                               runner_environment=runner)
    assert set(extended) == base | identity | {"OPENAI_API_KEY", "AWS_REGION", "AWS_SECRET"}


def test_herder_variables_never_pass_even_when_pass_env_names_them():
    """pass_env is checked at config load; job_environment refuses them again."""
    env = job_environment(a_job(), "h", "m", Path("/l"), ("HERDER_*", "HERDER_DB", "*"),
                          runner_environment={"PATH": "/bin", "OTHER": "x", **SECRETS})
    assert not set(SECRETS) & set(env)
    assert env["OTHER"] == "x"  # "*" passes everything else


def test_the_jobs_own_env_is_kept_but_herder_sets_its_identity_last():
    job = a_job({"GREETING": "hi", "PATH": "/job/bin", "HERDER_JOB_ID": "999",
                 TOKEN_VARIABLE: "forged", "HERDER_DB": "sqlite:///the-submitters-own.db"})
    env = job_environment(job, "h", "7.2@h/1/1", Path("/l"),
                          runner_environment={"PATH": "/bin", **SECRETS})
    assert (env["GREETING"], env["PATH"]) == ("hi", "/job/bin")
    assert (env["HERDER_JOB_ID"], env[TOKEN_VARIABLE]) == ("7", "7.2@h/1/1")
    # What the submitter put in the job's env is theirs to give; the runner's is not used.
    assert env["HERDER_DB"] == "sqlite:///the-submitters-own.db"


@pytest.mark.parametrize("entry", ["HERDER_DB", "HERDER_API_TOKEN", "HERDER_AGENT_TOKEN",
                                   "HERDER_TOKEN_FILE", "HERDER_SERVER", "HERDER_*", "HER*",
                                   "*", "MY_ADMIN_TOKEN"])
def test_pass_env_refuses_herder_credentials_at_load(tmp_path: Path, entry: str):
    path = tmp_path / "herder.toml"
    path.write_text(f'[runtime]\nconcurrency = 2\npass_env = ["LANG", "{entry}"]\n\n'
                    '[server]\napi_token_env = "MY_ADMIN_TOKEN"\n')
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    message = str(raised.value)
    assert message.startswith(f"{path}:3: runtime.pass_env.1: "), message
    assert repr(entry) in message and "remove it from pass_env" in message


@pytest.mark.parametrize("entry", ["bad name", "A*B", "1X", ""])
def test_pass_env_refuses_what_is_not_a_name_or_prefix(tmp_path: Path, entry: str):
    path = tmp_path / "herder.toml"
    path.write_text(f'[runtime]\npass_env = ["{entry}"]\n')
    with pytest.raises(ConfigError, match=r":2: runtime\.pass_env\.0: .*PREFIX\* pattern"):
        load_config(path)


def test_pass_env_accepts_names_and_prefixes(tmp_path: Path):
    path = tmp_path / "herder.toml"
    path.write_text('[runtime]\npass_env = ["OPENAI_API_KEY", "AWS_*", "HERMES"]\n')
    assert load_config(path).settings.runtime.pass_env == ["OPENAI_API_KEY", "AWS_*", "HERMES"]


# -- real processes ---------------------------------------------------------------------------


def printed_environment(log: Path) -> dict[str, str]:
    lines = [line for line in log.read_text().splitlines() if not line.startswith("# herder")]
    return dict(line.split("=", 1) for line in lines if "=" in line)


def test_a_job_under_up_sees_no_herder_credential(tmp_path: Path, store_url: str):
    h = Harness(tmp_path, store_url, runtime={"pass_env": '["EXTRA_*"]'})
    try:
        job_id = h.submit(shell("env"), env={"GREETING": "hello"})
        db = store_url
        if db.startswith("postgresql://postgres@"):  # a password the server ignores (trust)
            db = db.replace("postgresql://postgres@", "postgresql://postgres:db-password-42@")
        # No --db: `up` itself must use HERDER_DB, so the variable really is herder's.
        result = run_herder("up", "--host", h.host, "--exit-when-idle", cwd=tmp_path,
                            config=h.config, env={**SECRETS, "HERDER_DB": db, "EXTRA_ONE": "1",
                                                  "UNLISTED_SECRET": "u-secret"})
        assert result.returncode == 0, result.stderr
        assert h.job(job_id).status is JobStatus.DONE, h.describe()

        log = h.log_dir / str(job_id) / "1.log"
        seen = printed_environment(log)
        text = log.read_text()
        for name, value in {**SECRETS, "HERDER_DB": db}.items():
            assert name not in seen, f"{name} reached the job"
            assert value not in text, f"the value of {name} reached the job"
        assert "db-password-42" not in text and "u-secret" not in text
        assert (seen["EXTRA_ONE"], seen["GREETING"], seen["PATH"]) == (
            "1", "hello", os.environ["PATH"])
        assert seen["HERDER_JOB_ID"] == str(job_id)
    finally:
        h.close()


def test_a_job_under_an_agent_sees_no_agent_token(make_fleet, tmp_path: Path, sqlite_url: str):
    fleet = make_fleet(tmp_path, sqlite_url)
    token = fleet.add_host("envhost", "--ram", "16", "--prime-workers", "1",
                           "--night-workers", "1")
    fleet.start_server()
    # The token only in the agent's environment, as the systemd unit gives it.
    fleet.agents["envhost"] = fleet.start(
        "agent-envhost", "agent", "--server", fleet.url, "--host", "envhost", "--log-dir",
        str(tmp_path / "agents" / "envhost"), "--no-ram-check",
        env={"HERDER_AGENT_TOKEN": token, "HERDER_SERVER": fleet.url})
    fleet.wait_agent("envhost")

    job_id = fleet.submit(["/bin/sh", "-c", "env"])
    fleet.wait_status(job_id, JobStatus.DONE)
    log = tmp_path / "agents" / "envhost" / str(job_id) / "1.log"
    wait_for(lambda: "# herder: exit 0" in log.read_text(), 10, "the job's log", fleet.describe)
    seen = printed_environment(log)
    assert token not in log.read_text(), "the agent's token reached its job"
    assert "HERDER_AGENT_TOKEN" not in seen and "HERDER_SERVER" not in seen
    assert (seen["HERDER_JOB_ID"], seen["HERDER_HOST"]) == (str(job_id), "envhost")
