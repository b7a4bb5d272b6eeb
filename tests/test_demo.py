"""`herder demo` is what a newcomer runs first: it must work and tell the truth."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_a_fleet_and_reports_caps_held(tmp_path):
    result = subprocess.run([sys.executable, "-m", "herder.cli", "demo"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "18 done" in result.stdout
    assert "every host stayed within its worker cap and RAM budget" in result.stdout
    for host in ("big-1", "mid-1", "lap-1"):
        assert f"-> {host}" in result.stdout or host in result.stdout
    # orchestrator jobs (12 GB) only fit the big host
    for line in result.stdout.splitlines():
        if "orchestrator ->" in line:
            assert line.endswith("big-1"), line
