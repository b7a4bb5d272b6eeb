"""Agents talk to the server over HTTPS: a real TLS server, a real agent trusting its CA."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest
from support.cli import herder_argv, run_herder
from support.environment import clean_environment
from support.ports import free_port
from support.waits import wait_for

from herder.core.model import JobStatus
from herder.store import open_store


def make_certificate(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "server.crt", folder / "server.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True)
    return cert, key


def test_agent_runs_a_job_over_https_and_rejects_an_untrusted_server(tmp_path: Path) -> None:
    cert, key = make_certificate(tmp_path)
    config = tmp_path / "herder.toml"
    url = f"sqlite:///{tmp_path}/herder.db"
    config.write_text(f'[herder]\ndb = "{url}"\nlog_dir = "{tmp_path}/logs"\n'
                      '[runtime]\nheartbeat_interval = "0.3s"\n'
                      '[fleet]\nscheduler_interval = "0.2s"\n')
    token = run_herder("host", "add", "tls-1", "--ram", "8", cwd=tmp_path, config=config,
                       check=True).stdout.strip()
    port = free_port()
    base = f"https://127.0.0.1:{port}"
    processes = []
    with open(tmp_path / "server.log", "wb") as log:
        processes.append(subprocess.Popen(
            herder_argv("server", "--listen", f"127.0.0.1:{port}", "--tls-cert", str(cert),
                        "--tls-key", str(key), config=config), cwd=tmp_path, stdout=log, stderr=log,
            start_new_session=True))
    store = open_store(url)
    trust = ssl.create_default_context(cafile=str(cert))
    try:
        def answers() -> bool:
            try:
                return httpx.get(f"{base}/healthz", verify=trust, timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(answers, 30, "the TLS server to answer /healthz",
                 (tmp_path / "server.log").read_text)
        # Plain HTTP to the TLS port is not served, and an untrusted certificate is refused.
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{base}/healthz", timeout=2)

        with open(tmp_path / "agent.log", "wb") as log:
            processes.append(subprocess.Popen(
                herder_argv("agent", "--server", base, "--host", "tls-1", "--ca", str(cert),
                            "--no-ram-check", "--log-dir", str(tmp_path / "agent-logs"),
                            config=config),
                cwd=tmp_path, stdout=log, stderr=log, start_new_session=True,
                env=clean_environment({"HERDER_AGENT_TOKEN": token})))
        job_id = int(run_herder("submit", "--", "sh", "-c", "echo over tls", cwd=tmp_path,
                                config=config, check=True).stdout)
        job = wait_for(lambda: (found := store.job_get(job_id)) is not None
                       and found.status.terminal and found, 30, "the job to end",
                       (tmp_path / "agent.log").read_text)
        assert job.status is JobStatus.DONE
        assert job.host == "tls-1"
        assert token not in (tmp_path / "agent.log").read_text()
        assert token not in (tmp_path / "server.log").read_text()
    finally:
        store.close()
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(20)
