"""The commands scripts run in loops import only what they use (no timing: which modules).

Each case runs the real command in a fresh interpreter and lists, at exit, which of the
server-side and presentation packages got imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.cli import CLI_TIMEOUT
from support.environment import clean_environment

SERVER_SIDE = ("fastapi", "starlette", "uvicorn", "httpx", "anyio", "asyncio", "psycopg",
               "herder.api", "herder.runtime", "herder.core.scheduling", "herder.cli.demo",
               "herder.store.postgres")
"""What the queue commands never need: the HTTP stack, the event loop, PostgreSQL's driver
and store (the database here is SQLite), the coordinator and the scheduler."""

HEAVY = (*SERVER_SIDE, "rich", "pydantic", "herder.wire", "herder.services.views",
         "importlib.resources", "dataclasses")
"""...nor a table library (their tables are plain text), the API's pydantic shapes (only
`--json` prints them), `importlib.resources` (the store reads its SQL by path), nor
`dataclasses`: on Python 3.11 each frozen dataclass costs ~1 ms to define, so the values
they build are msgspec Structs."""

OTHER_COMMANDS = ("herder.cli.agent", "herder.cli.alerts", "herder.cli.hosts",
                  "herder.cli.project", "herder.cli.server", "herder.cli.slots",
                  "herder.cli.tokens")
"""The command modules besides `herder.cli.jobs`, where the queue commands live."""

PROBE = """
import atexit, json, sys
watched = json.loads(sys.argv[1])
def report():
    loaded = sorted(name for name in watched
                    if any(module == name or module.startswith(name + ".")
                           for module in sys.modules))
    sys.stderr.write("imported: " + json.dumps(loaded) + "\\n")
atexit.register(report)
from herder.cli import main
main(sys.argv[2:])
"""


def imported(tmp_path: Path, *args: str) -> list[str]:
    """The watched packages the command `herder ARGS...` imported; it must succeed (or skip)."""
    watched = [*HEAVY, *OTHER_COMMANDS, "herder.services.intake", "herder.core.submission"]
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(watched), *args], cwd=tmp_path,
        env=clean_environment({"HERDER_DB": f"sqlite:///{tmp_path / 'herder.db'}"}),
        capture_output=True, text=True, timeout=CLI_TIMEOUT, check=False)
    assert result.returncode in (0, 10), (args, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.startswith("imported: ")]
    assert len(lines) == 1, result.stderr
    return list(json.loads(lines[0].removeprefix("imported: ")))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A project with one job in its SQLite database."""
    imported(tmp_path, "submit", "--dedup-key", "held", "--", "true")
    return tmp_path


@pytest.mark.parametrize("args", [
    ("submit", "--", "true"),
    ("jobs",),
    ("show", "1"),
    ("should-dispatch", "held"),
    ("should-dispatch", "free"),
    ("cancel", "1"),
])
def test_commands_scripts_loop_on_import_nothing_heavy_nor_other_commands(folder, args):
    # herder.toml is checked by herder.core.settings's own walk, a submit is a plain Struct
    # (herder.core.submission) and the tables are plain text: pydantic (~45 ms to import) is
    # for the HTTP API, and rich (~30 ms, as much again to lay out a table) is no longer
    # used by any command: it stays listed so that it does not come back unnoticed.
    assert set(imported(folder, *args)) & {*HEAVY, *OTHER_COMMANDS} == set()


@pytest.mark.parametrize("args", [("jobs",), ("show", "1"), ("should-dispatch", "held"),
                                  ("cancel", "1")])
def test_only_submit_loads_what_renders_and_checks_a_submit(folder, args):
    submit = {"herder.services.intake", "herder.core.submission"}
    assert submit <= set(imported(folder, "submit", "--", "true"))
    assert set(imported(folder, *args)) & submit == set()


@pytest.mark.parametrize("args", [("jobs", "--json"), ("show", "1", "--json")])
def test_json_output_loads_the_api_shapes_but_nothing_server_side(folder, args):
    found = set(imported(folder, *args))
    assert "pydantic" in found
    assert found & {*SERVER_SIDE, "rich", *OTHER_COMMANDS} == set()


def test_the_command_line_itself_loads_no_configuration_store_or_command(tmp_path):
    # `--help` lists every command from its module; the settings, the store and what they
    # import are loaded only by commands that use them.
    assert set(imported(tmp_path, "--help")) == set(OTHER_COMMANDS)
    probe = ("import sys, herder.cli; print(sorted(m for m in sys.modules "
             "if m.startswith(('herder.', 'pydantic', 'rich'))))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=clean_environment(),
                            capture_output=True, text=True, timeout=CLI_TIMEOUT, check=True)
    assert result.stdout.strip() == ("['herder.cli', 'herder.cli.root', 'herder.core', "
                                    "'herder.core.errors']")


def test_every_named_command_loads_from_its_module_under_its_name():
    from herder.cli.root import COMMANDS, main

    assert sorted(main.commands) == sorted(COMMANDS)
    for name, where in COMMANDS.items():
        command = main.commands[name]
        assert command.name == name, where
        assert command.callback is not None and command.callback.__module__ == where.split(":")[0]


def test_up_loads_no_web_server_unless_asked_for_the_dashboard(tmp_path):
    # `herder up --ui` starts uvicorn and the app in a thread; plain `up` must not pay for it.
    assert set(imported(tmp_path, "up", "--exit-when-idle")) & {
        "uvicorn", "fastapi", "starlette", "herder.api"} == set()
