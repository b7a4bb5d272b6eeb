"""Finding and reading herder.toml: its path (an argument, HERDER_CONFIG or ./herder.toml),
the settings it holds, and what is resolved against it (relative paths, the database URL
from --db, HERDER_DB or the file)."""

import os
import re
from pathlib import Path

from msgspec import Struct

from herder.core.errors import ConfigError, InputError
from herder.core.settings.fields import Invalid
from herder.core.settings.sections import Settings
from herder.core.settings.toml_lines import located
from herder.core.settings.validation import build, cross_check
from herder.core.urls import DEFAULT_DB

CONFIG_FILE = "herder.toml"


class Config(Struct, frozen=True):
    """Validated settings plus where they came from (relative paths resolve against it)."""

    settings: Settings
    path: Path | None

    @property
    def base_dir(self) -> Path:
        return self.path.parent if self.path else Path.cwd()

    def resolve_path(self, value: str) -> Path:
        path = Path(os.path.expanduser(value))
        return path if path.is_absolute() else (self.base_dir / path)

    @property
    def log_dir(self) -> Path:
        return self.resolve_path(self.settings.herder.log_dir)

    def where(self, loc: list[str]) -> str:
        """`file:line: key` for a key of this file, for a check made after loading (one
        that needs more than the settings module imports)."""
        try:
            text = self.path.read_text() if self.path is not None else ""
        except OSError:
            text = ""
        return located(self.path, text, loc)

    def db_url(self, override: str | None = None) -> str:
        """--db, then HERDER_DB, then the config's [herder] db, then ./herder.db."""
        url = override or os.environ.get("HERDER_DB") or self.settings.herder.db
        if url is None:
            return DEFAULT_DB
        if not override and not os.environ.get("HERDER_DB") and url.startswith("sqlite:///"):
            rest = url[len("sqlite:///"):]
            if not rest.startswith("/"):
                return "sqlite:///" + str(self.resolve_path(rest))
        return url

    def check_weight(self, weight: str, field: str = "weight") -> None:
        if weight not in self.settings.weights:
            known = ", ".join(sorted(self.settings.weights))
            raise InputError(field, f"unknown weight {weight!r}", f"use one of: {known}")


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Load herder.toml from `path`, HERDER_CONFIG or ./herder.toml; defaults if absent."""
    explicit = path is not None or bool(os.environ.get("HERDER_CONFIG"))
    candidate = Path(path or os.environ.get("HERDER_CONFIG") or CONFIG_FILE)
    if not candidate.exists():
        if explicit:
            raise ConfigError(str(candidate), "file not found", "run `herder init` to write one")
        return Config(Settings(), None)
    import tomllib  # only with a file to read: the parser is a few ms of every start

    text = candidate.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        at = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        where = f"{candidate}:{at.group(1)}" if at else str(candidate)
        raise ConfigError(where, f"invalid TOML: {exc}") from exc
    try:
        settings: Settings = build(Settings, data, [])
    except Invalid as exc:
        raise ConfigError(located(candidate, text, exc.loc), exc.message) from exc
    config = Config(settings, candidate.resolve())
    cross_check(settings, data, lambda loc: located(config.path, text, loc),
                config.resolve_path)
    return config


def sample_config() -> str:
    """The commented herder.toml that `herder init` writes."""
    from importlib import resources  # only `herder init` reads it

    return resources.files("herder").joinpath("sample.toml").read_text()
