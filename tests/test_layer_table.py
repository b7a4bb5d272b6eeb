"""Every import in herder/, read from the source (function-level and `TYPE_CHECKING` ones
included), runs down the layer table, and no modules import each other round a cycle.

The import-time checks in test_layers.py see only what loads; this one sees every arrow."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "herder"

LAYERS: list[tuple[str, ...]] = [
    ("herder.core",),
    ("herder.store",),
    ("herder.wire",),
    ("herder.runtime",),
    ("herder.services", "herder.client"),
    ("herder.api",),
    ("herder.cli",),
]
"""Bottom to top: a module imports its own layer or the ones below. `herder.client` is the
documented import path of the Python API, a re-export of the operations service."""

def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = modules()


def resolved(name: str) -> str | None:
    """The herder module an imported name lives in (a package's name for its attributes)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str, path: Path) -> Iterator[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            module = resolved(target) if target.startswith("herder.") else None
            if module is not None and module not in (name, "herder"):
                yield module


GRAPH = {name: set(imports_of(name, path)) for name, path in MODULES.items()}


def layer(name: str) -> int | None:
    for index, prefixes in enumerate(LAYERS):
        if any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes):
            return index
    return None


def test_every_module_has_a_layer():
    assert sorted(name for name in MODULES if name != "herder" and layer(name) is None) == []


def upward() -> set[tuple[str, str]]:
    arrows = set()
    for name, targets in GRAPH.items():
        for target in targets:
            low, high = layer(name), layer(target)
            if low is not None and high is not None and high > low:
                arrows.add((name, target))
    return arrows


def test_no_import_runs_up_the_layers():
    assert sorted(upward()) == []


def cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return found


def test_no_modules_import_each_other_round_a_cycle():
    assert cycles() == []


@pytest.mark.parametrize("source, expected", [
    ("import herder.core.model", {"herder.core.model"}),
    ("from herder.core import model", {"herder.core.model"}),
    ("from herder.core.model import Job", {"herder.core.model"}),
    ("def f():\n    from herder.store import Store", {"herder.store"}),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from herder.api import app",
     {"herder.api.app"}),
    ("from . import errors", {"herder.core.errors"}),
])
def test_every_form_of_import_is_seen(tmp_path, source, expected):
    path = tmp_path / "example.py"
    path.write_text(source)
    assert set(imports_of("herder.core.example", path)) == expected
