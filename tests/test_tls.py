"""Agents talk to the server over HTTPS: a real TLS server, a real agent trusting its CA."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from herder.model import JobStatus
from herder.store import open_store


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    cli = [sys.executable, "-m", "herder.cli", "--config", str(config)]
    token = subprocess.run([*cli, "host", "add", "tls-1", "--ram", "8"], capture_output=True,
                           text=True, check=True, cwd=tmp_path).stdout.strip()
    port = free_port()
    base = f"https://127.0.0.1:{port}"
    processes = []
    with open(tmp_path / "server.log", "wb") as log:
        processes.append(subprocess.Popen(
            [*cli, "server", "--listen", f"127.0.0.1:{port}", "--tls-cert", str(cert),
             "--tls-key", str(key)], cwd=tmp_path, stdout=log, stderr=log,
            start_new_session=True))
    store = open_store(url)
    trust = ssl.create_default_context(cafile=str(cert))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/healthz", verify=trust, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        # Plain HTTP to the TLS port is not served, and an untrusted certificate is refused.
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{base}/healthz", timeout=2)

        with open(tmp_path / "agent.log", "wb") as log:
            processes.append(subprocess.Popen(
                [*cli, "agent", "--server", base, "--host", "tls-1", "--ca", str(cert),
                 "--no-ram-check", "--log-dir", str(tmp_path / "agent-logs")],
                cwd=tmp_path, stdout=log, stderr=log, start_new_session=True,
                env={**os.environ, "HERDER_AGENT_TOKEN": token}))
        job_id = int(subprocess.run([*cli, "submit", "--", "sh", "-c", "echo over tls"],
                                    capture_output=True, text=True, check=True,
                                    cwd=tmp_path).stdout)
        deadline = time.monotonic() + 30
        while (job := store.job_get(job_id)) is None or not job.status.terminal:
            assert time.monotonic() < deadline, (tmp_path / "agent.log").read_text()
            time.sleep(0.05)
        assert job.status is JobStatus.DONE
        assert job.host == "tls-1"
        assert token not in (tmp_path / "agent.log").read_text()
        assert token not in (tmp_path / "server.log").read_text()
    finally:
        store.close()
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(20)
