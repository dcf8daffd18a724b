"""Request signing (seed §5.1).

``X-Signature`` is the lowercase hex HMAC-SHA1 of the exact body bytes, keyed with the destination's
shared secret, and is sent only when a secret is set. A receiver recomputes it over the bytes it
received and compares in constant time.

    >>> sign(b'{"a":1}', "s3cret")
    '79999786a1bff10cd4d7dd0b0752574af76be0b5'

Standard Webhooks (``standard_webhooks_headers``): ``v1`` signatures are HMAC-SHA256 with a shared
secret; ``v1a`` signatures are Ed25519 with a destination's signing key (``whsk_`` + base64 of
its 32 bytes), which its receivers verify with the public key (``whpk_`` + base64), holding no
secret at all.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
from collections.abc import Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

__all__ = [
    "sign",
    "verify",
    "SIGNATURE_HEADER",
    "standard_webhooks_headers",
    "verify_standard_webhooks",
    "STANDARD_WEBHOOKS_TOLERANCE",
    "check_signing_key",
    "new_signing_key",
    "public_key_of",
    "verify_ed25519",
]

SIGNING_KEY_PREFIX = "whsk_"
PUBLIC_KEY_PREFIX = "whpk_"

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


def _signed_content(message_id: str, timestamp: int, body: bytes) -> bytes:
    """What Standard Webhooks signs, ``v1`` and ``v1a`` alike: ``id.timestamp.body``."""
    return f"{message_id}.{timestamp}.".encode() + body


def _standard_signature(message_id: str, timestamp: int, body: bytes, secret: str) -> str:
    signed = _signed_content(message_id, timestamp, body)
    digest = hmac.new(_standard_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def standard_webhooks_headers(
    message_id: str,
    timestamp: int,
    body: bytes,
    *secrets: str,
    signing_key: str | None = None,
) -> dict[str, str]:
    """``webhook-id``, ``webhook-timestamp`` and ``webhook-signature`` (Standard Webhooks).

    Each of ``secrets`` adds a ``v1,`` signature (base64 HMAC-SHA256 of ``id.timestamp.body``;
    several during a rotation), and ``signing_key`` a ``v1a,`` one (Ed25519 of the same), all
    space-separated, as the spec allows: a receiver holding any one secret, or the public key,
    verifies the request. A receiver that checks the timestamp against its clock rejects a
    captured request replayed later.
    """
    signatures = [_standard_signature(message_id, timestamp, body, key) for key in secrets]
    if signing_key is not None:
        signature = _private_key(signing_key).sign(_signed_content(message_id, timestamp, body))
        signatures.append("v1a," + base64.b64encode(signature).decode())
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
    fresh = _fresh(headers, now, tolerance)
    if fresh is None:
        return False
    message_id, stamp, signatures = fresh
    expected = _standard_signature(message_id, stamp, body, secret).encode()
    return any(
        hmac.compare_digest(expected, candidate.encode("ascii", "replace"))
        for candidate in signatures
    )


def _fresh(
    headers: Mapping[str, str], now: float, tolerance: float
) -> tuple[str, int, list[str]] | None:
    """The Standard Webhooks headers' id, timestamp and signatures, if the timestamp is within
    ``tolerance`` of ``now`` (``None``: missing, malformed or stale)."""
    lowered = {k.lower(): v for k, v in headers.items()}
    message_id = lowered.get("webhook-id")
    stamp = lowered.get("webhook-timestamp", "")
    if not message_id or not stamp.isdigit() or abs(now - int(stamp)) > tolerance:
        return None
    return message_id, int(stamp), lowered.get("webhook-signature", "").split()


def new_signing_key() -> str:
    """A new Ed25519 signing key: ``whsk_`` + base64 of its 32 private bytes."""
    raw = Ed25519PrivateKey.generate().private_bytes_raw()
    return SIGNING_KEY_PREFIX + base64.b64encode(raw).decode()


def check_signing_key(key: str) -> str:
    """``key`` if it is a signing key (``whsk_`` + base64 of 32 bytes); ``ValueError`` naming
    the problem, never the key, otherwise."""
    _raw(key, SIGNING_KEY_PREFIX, "signing key")
    return key


def public_key_of(signing_key: str) -> str:
    """The public key receivers verify ``v1a`` signatures with: ``whpk_`` + base64 of 32 bytes."""
    raw = _private_key(signing_key).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return PUBLIC_KEY_PREFIX + base64.b64encode(raw).decode()


def verify_ed25519(
    headers: Mapping[str, str],
    body: bytes,
    public_key: str,
    *,
    now: float,
    tolerance: float = STANDARD_WEBHOOKS_TOLERANCE,
) -> bool:
    """True when a ``v1a`` signature of the Standard Webhooks headers verifies ``body`` with
    ``public_key`` (``whpk_…``) and the timestamp is fresh."""
    fresh = _fresh(headers, now, tolerance)
    if fresh is None:
        return False
    message_id, stamp, signatures = fresh
    key = Ed25519PublicKey.from_public_bytes(_raw(public_key, PUBLIC_KEY_PREFIX, "public key"))
    signed = _signed_content(message_id, stamp, body)
    for candidate in signatures:
        version, _, signature = candidate.partition(",")
        if version != "v1a":
            continue
        try:
            key.verify(base64.b64decode(signature), signed)
            return True
        except (InvalidSignature, binascii.Error, ValueError):
            continue
    return False


@functools.lru_cache(maxsize=1024)
def _private_key(signing_key: str) -> Ed25519PrivateKey:
    """The key object of ``signing_key``, made once (a request signs with it)."""
    return Ed25519PrivateKey.from_private_bytes(
        _raw(signing_key, SIGNING_KEY_PREFIX, "signing key")
    )


def _raw(key: str, prefix: str, what: str) -> bytes:
    if not key.startswith(prefix):
        raise ValueError(f"is not an Ed25519 {what}: it must start with {prefix!r}")
    try:
        raw = base64.b64decode(key[len(prefix) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"is not an Ed25519 {what}: {prefix} must be followed by base64") from None
    if len(raw) != 32:
        raise ValueError(f"is not an Ed25519 {what}: it must hold 32 bytes, not {len(raw)}")
    return raw
