"""Imports run one way: api → runtime → scheduling/store → model. Each check imports a
module in a fresh interpreter and lists what came in with it."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import pytest


def imported_with(module: str) -> set[str]:
    script = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, check=True)
    return set(json.loads(result.stdout))


def under(modules: set[str], package: str) -> set[str]:
    return {name for name in modules if name == package or name.startswith(package + ".")}


@pytest.mark.parametrize("module", ["herder.runtime.coordinator", "herder.runtime.agent",
                                    "herder.runtime.runner"])
def test_the_runtime_does_not_import_the_api(module):
    modules = imported_with(module)
    assert module in modules
    assert under(modules, "herder.api") == set()


def test_the_contract_needs_neither_fastapi_nor_the_server():
    import herder.wire

    contract = [f"herder.wire.{module.name}"
                for module in pkgutil.iter_modules(herder.wire.__path__)]
    modules = imported_with(", ".join(contract))
    assert {"herder.wire", "herder.wire.jobs", "herder.wire.agents"} <= modules
    assert under(modules, "fastapi") | under(modules, "herder.api") == set()
    assert under(modules, "herder.runtime") | under(modules, "herder.store") == set()


def test_an_agent_does_not_load_fastapi():
    assert under(imported_with("herder.runtime.agent"), "fastapi") == set()


def test_the_coordinator_does_not_import_the_operations():
    """The operations service sits above the runtime: the server composes the two."""
    modules = imported_with("herder.runtime.coordinator")
    assert under(modules, "herder.services") | under(modules, "herder.client") == set()
