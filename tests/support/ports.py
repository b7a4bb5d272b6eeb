"""A free TCP port on 127.0.0.1 for a server a test starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on right now (another process may still take it before the
    test binds it; the private PostgreSQL cluster retries for that reason)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
