"""Host-bound agent tokens: shown once, stored only as a SHA-256 hash."""

from __future__ import annotations

import hashlib
import hmac
import secrets

TOKEN_PREFIX = "hdr_"


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str, stored_hash: str | None) -> bool:
    """Constant-time comparison, so a probe learns nothing from timing."""
    if stored_hash is None:
        return False
    return hmac.compare_digest(token_hash(token), stored_hash)
