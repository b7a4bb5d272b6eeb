"""Every data file herder reads at run time is in the wheel: an installed herder reads its SQL
and sample herder.toml from the package folder, and a file the package-data globs miss
exists only in a checkout (the editable install the tests run from)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_package_data_globs_cover_every_data_file_in_the_package():
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = settings["tool"]["setuptools"]["package-data"]["herder"]
    package = ROOT / "herder"
    shipped = {path for pattern in patterns for path in package.glob(pattern)}
    data = {path for path in package.rglob("*") if path.is_file()
            and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts}
    assert {"queries.sql", "sample.toml"} <= {path.name for path in data}
    assert sorted(str(path.relative_to(package)) for path in data - shipped) == []
