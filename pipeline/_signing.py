"""Request signing (seed §5.1).

``X-Signature`` is the lowercase hex HMAC-SHA1 of the exact body bytes, keyed with the destination's
shared secret, and is sent only when a secret is set. A receiver recomputes it over the bytes it
received and compares in constant time.

    >>> sign(b'{"a":1}', "s3cret")
    '79999786a1bff10cd4d7dd0b0752574af76be0b5'
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["sign", "verify", "SIGNATURE_HEADER"]

SIGNATURE_HEADER = "X-Signature"


def sign(body: bytes, secret: str) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha1).hexdigest()


def verify(body: bytes, secret: str, signature: str | None) -> bool:
    """True when ``signature`` is the HMAC-SHA1 of ``body`` under ``secret``."""
    if not signature:
        return False
    try:
        given = signature.strip().lower().encode("ascii")
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(sign(body, secret).encode("ascii"), given)
