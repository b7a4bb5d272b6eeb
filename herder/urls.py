"""Database URLs: which backend, and how to print one without its secret."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

DEFAULT_DB = "sqlite:///herder.db"


def redact_url(url: str) -> str:
    """The URL with any password replaced, safe for logs and error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = (parts.username or "") + ":***"
    return urlunsplit(parts._replace(netloc=f"{user}@{netloc[-1]}"))
