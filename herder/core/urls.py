"""URLs: how to print a database URL (or a text quoting one) without its secret, what a
bound socket answers on, whether a name is loopback."""

from __future__ import annotations

import ipaddress
import re
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


URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def redact_urls_in(text: str) -> str:
    """A text (an error from below may quote the URL it could not open) with every URL's
    password replaced as `redact_url` does; a URL that does not parse is hidden whole."""

    def redacted(match: re.Match[str]) -> str:
        try:
            return redact_url(match.group())
        except ValueError:  # e.g. an unclosed IPv6 bracket
            return match.group().partition("://")[0] + "://***"

    return URL_IN_TEXT.sub(redacted, text)


def listen_url(scheme: str, sockname: tuple[object, ...] | str) -> str:
    """The URL a bound socket answers on (`getsockname()`): an IPv6 address in brackets."""
    if isinstance(sockname, str):  # a Unix socket's path
        return f"{scheme}+unix://{sockname}"
    host, port = str(sockname[0]), sockname[1]
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def loopback_name(name: str) -> bool:
    """localhost, or a loopback address (127.0.0.0/8, ::1; brackets allowed)."""
    if name.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False
