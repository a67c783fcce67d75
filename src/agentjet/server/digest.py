"""The one way secrets are hashed and compared: episode keys, tokens and team secrets are kept and compared
as SHA-256 digests, in constant time."""

from __future__ import annotations

import hashlib
import hmac


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def matches(given: str | None, expected_digest: str | None) -> bool:
    """``given`` hashes to ``expected_digest`` (False when either is missing), compared in constant time."""
    if not given or not expected_digest:
        return False
    return hmac.compare_digest(digest(given), expected_digest)
