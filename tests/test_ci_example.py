"""examples/github-actions.yml, as a runner would run it: its `herder` steps, the same shell
lines with the job's environment, against a real server with a submit token."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from support.environment import clean_environment

from herder.core.access import new_token, token_hash
from herder.core.model import Scope

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / "examples" / "github-actions.yml"


def workflow() -> dict[str, Any]:
    loaded = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(loaded, dict)
    return loaded


def expand(value: str, context: dict[str, str]) -> str:
    """GitHub's `${{ name }}` expressions, from `context`."""
    def one(match: re.Match[str]) -> str:
        return context[match.group(1)]

    return re.sub(r"\$\{\{\s*([\w.]+)\s*\}\}", one, value)


def test_the_docs_show_the_example_as_it_is():
    page = (ROOT / "docs" / "operating.md").read_text()
    assert WORKFLOW.read_text() in page


def test_the_workflow_claims_a_slot_and_releases_it_whatever_happened(make_fleet, tmp_path,
                                                                     sqlite_url):
    fleet = make_fleet(tmp_path, sqlite_url)
    fleet.add_host("ci-1", "--ram", "16")
    fleet.start_server()
    secret = new_token()
    fleet.store.token_insert("ci", Scope.SUBMIT, token_hash(secret), datetime.now(UTC))

    job = workflow()["jobs"]["e2e"]
    context = {"secrets.HERDER_SUBMIT_TOKEN": secret, "github.run_id": "4242",
               "github.run_attempt": "1"}
    env = {name: expand(str(value), context) for name, value in job["env"].items()}
    assert env["HERDER_SERVER"].startswith("https://")  # the example's; this test's is http
    env["HERDER_SERVER"] = fleet.url
    # the `herder` this interpreter runs, first on PATH as on a runner where it is installed
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    steps = {step.get("name", ""): step for step in job["steps"]}
    claim = steps["Book RAM for the browser tests"]
    release = steps["Give the RAM back"]
    assert release.get("if") == "always()" and "if" not in claim
    assert list(steps).index("Browser tests") == list(steps).index(claim["name"]) + 1

    def run(step: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["sh", "-e", "-c", step["run"]], cwd=tmp_path,
                                env=clean_environment(env), capture_output=True, text=True,
                                timeout=60, check=False)
        assert result.returncode == 0, (step["run"], result.stdout, result.stderr)
        return result

    def headroom() -> str:
        return fleet.cli("ram", "ci-1").stdout.strip()

    assert headroom() == "12.8"  # 80% of 16 GB
    slot = run(claim).stdout.strip()
    assert slot.isdigit()
    assert headroom() == "6.8"  # playwright's 6 GB booked
    assert run(claim).stdout.strip() == slot  # a re-run step books nothing more
    assert headroom() == "6.8"
    # the heavy step failed: `if: always()` still gives the RAM back
    assert run(release).stdout == "released\n"
    assert headroom() == "12.8"
    assert run(release).stdout == "nothing to release\n"  # and once only
