"""A herder.toml for a test: sections of settings, fast timings chosen by each harness."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def toml_value(value: Any) -> str:
    """The TOML literal of a Python value (strings quoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    raise TypeError(f"no TOML literal for {value!r}")


def write_config(path: Path, sections: Mapping[str, Mapping[str, str]], extra: str = "") -> Path:
    """Write `sections` (values are TOML literals) and then the raw text `extra` to `path`."""
    lines: list[str] = []
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {value}" for key, value in values.items()]
        lines.append("")
    path.write_text("\n".join(lines) + "\n" + extra)
    return path
