"""Request signing (seed §5.1).

``X-Signature`` is the lowercase hex HMAC-SHA1 of the exact body bytes, keyed with the destination's
shared secret, and is sent only when a secret is set. A receiver recomputes it over the bytes it
received and compares in constant time.

    >>> sign(b'{"a":1}', "s3cret")
    '79999786a1bff10cd4d7dd0b0752574af76be0b5'
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

__all__ = [
    "sign",
    "verify",
    "SIGNATURE_HEADER",
    "standard_webhooks_headers",
    "verify_standard_webhooks",
    "STANDARD_WEBHOOKS_TOLERANCE",
]

#: Standard Webhooks: a receiver rejects a timestamp further than this from its clock (seconds).
STANDARD_WEBHOOKS_TOLERANCE = 300

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


def _standard_key(secret: str) -> bytes:
    """A ``whsec_``-prefixed secret is base64 (the spec's form); any other is used as UTF-8."""
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret[len("whsec_") :], validate=True)
        except ValueError:
            pass
    return secret.encode()


def _standard_signature(message_id: str, timestamp: int, body: bytes, secret: str) -> str:
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(_standard_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def standard_webhooks_headers(
    message_id: str, timestamp: int, body: bytes, secret: str, *also: str
) -> dict[str, str]:
    """``webhook-id``, ``webhook-timestamp`` and ``webhook-signature`` (Standard Webhooks v1).

    The signature is ``v1,`` + base64 HMAC-SHA256 of ``id.timestamp.body``; a receiver that checks
    the timestamp against its clock rejects a captured request replayed later. ``also``: more
    secrets (a rotation's previous ones), each adding its signature, space-separated, as the
    spec allows: a receiver holding any one of them verifies the request.
    """
    signatures = [_standard_signature(message_id, timestamp, body, key) for key in (secret, *also)]
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signatures),
    }


def verify_standard_webhooks(
    headers: Mapping[str, str],
    body: bytes,
    secret: str,
    *,
    now: float,
    tolerance: float = STANDARD_WEBHOOKS_TOLERANCE,
) -> bool:
    """True when the Standard Webhooks headers sign ``body`` and the timestamp is fresh."""
    lowered = {k.lower(): v for k, v in headers.items()}
    message_id = lowered.get("webhook-id")
    stamp = lowered.get("webhook-timestamp", "")
    signatures = lowered.get("webhook-signature", "")
    if not message_id or not stamp.isdigit() or abs(now - int(stamp)) > tolerance:
        return False
    expected = _standard_signature(message_id, int(stamp), body, secret).encode()
    return any(
        hmac.compare_digest(expected, candidate.encode("ascii", "replace"))
        for candidate in signatures.split()
    )
