"""Where a dotted key is written in a TOML file, so that an error names its line: tomllib
gives values, not positions, so the line is found again in the text (best effort)."""

import re
from pathlib import Path


def located(path: Path | str | None, text: str, loc: list[str]) -> str:
    """`file:line: key` for the key at `loc` (`file: key` when its line is not found)."""
    line = line_of(text, loc)
    prefix = f"{path}:{line}" if line else str(path)
    return f"{prefix}: {'.'.join(loc)}"


def line_of(text: str, loc: list[str]) -> int | None:
    """Best-effort line number of a dotted key: find its table header, then the key."""
    lines = text.splitlines()
    for split in range(len(loc), -1, -1):
        table, keys = loc[:split], loc[split:]
        header = _find_header(lines, table) if table else -1
        if header is None:
            continue
        if not keys:
            return header + 1
        found = _find_key(lines, header + 1, keys)
        if found is not None:
            return found + 1
        if table:
            return header + 1
    if loc:  # a table that only appears through its sub-tables, like [job_types.x]
        header = _find_header(lines, loc, prefix=True)
        if header is not None:
            return header + 1
    return None


def _find_key(lines: list[str], start: int, keys: list[str]) -> int | None:
    """The line (0-based) from `start` to the next header that assigns `keys`, written
    plainly (`a = `), dotted (`a.b = `) or as an inline table (`a = { b = ... }`)."""
    for count in range(len(keys), 0, -1):
        dotted = r"\s*\.\s*".join(
            rf"(?:\"{re.escape(k)}\"|'{re.escape(k)}'|{re.escape(k)})" for k in keys[:count]
        )
        pattern = re.compile(rf"^\s*{dotted}\s*[=.]")
        for index in range(start, len(lines)):
            if _HEADER.match(lines[index]):
                break
            if pattern.match(lines[index]):
                return index
    return None


_HEADER = re.compile(r"^\s*\[(?!\[)\s*([^\]]+?)\s*\]\s*(?:#.*)?$")


def _find_header(lines: list[str], table: list[str], prefix: bool = False) -> int | None:
    wanted = ".".join(table)
    for index, line in enumerate(lines):
        match = _HEADER.match(line)
        if match:
            name = ".".join(part.strip().strip("\"'") for part in match.group(1).split("."))
            if name == wanted or (prefix and name.startswith(wanted + ".")):
                return index
    return None
