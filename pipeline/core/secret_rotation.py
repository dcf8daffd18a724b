"""Rotating a destination's shared secret (``previous_secrets`` in the config file).

``pipeline config rotate-secret`` and the console's button give a destination a new random
secret (``new_secret``) and keep the old one as a previous secret until a window ends
(``rotated``). While windows are open, ``X-Signature`` is made with the first secret rotated out
whose window is still open, so a receiver that has not switched yet never rejects a request, and
Standard Webhooks' ``webhook-signature`` carries one signature a live secret
(``signing_secrets``). Once a
window ends its secret signs nothing, and the deliver role writes the destination again without
it (``without_ended_secrets``).

    >>> from pipeline.core.config import Destination
    >>> d = Destination(id="d", sources=["s"], webhooks=[{"url": "https://a.example/"}],
    ...     shared_secret="new", previous_secrets=[{"secret": "old", "until": "2026-12-01T00:00:00Z"}])
    >>> signing_secrets(d, 0.0), signing_secrets(d, 2e9)
    (('old', ['new', 'old']), ('new', ['new']))
"""

from __future__ import annotations

import base64
import secrets
from datetime import UTC, datetime

from pipeline.core.config import (
    MAX_PREVIOUS_SECRETS,
    MAX_ROTATION_WINDOW,
    Destination,
    PreviousSecret,
)
from pipeline.core.durations import format_duration
from pipeline.core.signing import new_signing_key

__all__ = [
    "MIN_WINDOW",
    "keyed",
    "new_secret",
    "rotated",
    "signing_secrets",
    "without_ended_secrets",
]

#: The shortest rotation window ``rotated`` takes (seconds).
MIN_WINDOW = 60.0


def new_secret() -> str:
    """A new random shared secret, in the Standard Webhooks form (``whsec_`` + base64 of 24
    bytes), which ``X-Signature`` uses as it is (its UTF-8 bytes)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def signing_secrets(destination: Destination, now: float) -> tuple[str, list[str]]:
    """The secret ``X-Signature`` is made with at ``now`` (epoch seconds): the first rotated out
    (``previous_secrets`` is oldest first) whose window is still open; and every secret Standard
    Webhooks signs with, the current one first."""
    current = destination.shared_secret
    assert current is not None
    if not destination.previous_secrets:
        return current, [current]
    at = int(now * 1000)
    live = [p for p in destination.previous_secrets if p.until_ms > at]  # oldest rotated first
    if not live:
        return current, [current]
    return live[0].secret, [current, *(p.secret for p in live)]


def rotated(destination: Destination, secret: str, window: float, now: float) -> Destination:
    """``destination`` with ``secret`` as its shared secret, and its current one a previous
    secret until ``window`` seconds from ``now`` (previous secrets whose windows ended are
    dropped). ``ValueError`` naming the problem: no secret to rotate, a window outside 1m..7d,
    or as many windows open as allowed."""
    if not destination.shared_secret:
        raise ValueError(f"destination {destination.id!r} has no shared_secret to rotate; set one")
    if not MIN_WINDOW <= window <= MAX_ROTATION_WINDOW:
        raise ValueError(
            f"window: {format_duration(window)} is outside "
            f"{format_duration(MIN_WINDOW)}..{format_duration(MAX_ROTATION_WINDOW)}"
        )
    live = without_ended_secrets(destination, now).previous_secrets
    if len(live) >= MAX_PREVIOUS_SECRETS:
        raise ValueError(
            f"destination {destination.id!r} already has {len(live)} rotation windows open "
            f"(at most {MAX_PREVIOUS_SECRETS}); wait until the first ends"
        )
    # Whole milliseconds, as the config topic keeps it: the written destination reads back equal.
    until = datetime.fromtimestamp(int((now + window) * 1000) / 1000, UTC)
    previous = [*live, PreviousSecret(secret=destination.shared_secret, until=until)]
    return destination.model_copy(update={"shared_secret": secret, "previous_secrets": previous})


def keyed(destination: Destination, current: Destination | None) -> Destination:
    """``destination`` with an Ed25519 signing key when it asks for ``signing: ed25519`` and its
    file has none: the key ``current`` (the live version) has, else a new one. So a config file
    need not hold the private key, and applying it again keeps the key receivers know."""
    if destination.signing is None or destination.signing_key is not None:
        return destination
    key = current.signing_key if current is not None and current.signing_key else None
    return destination.model_copy(update={"signing_key": key or new_signing_key()})


def without_ended_secrets(destination: Destination, now: float) -> Destination:
    """``destination`` without the previous secrets whose windows ended by ``now`` (itself when
    none did)."""
    at = int(now * 1000)
    live = [p for p in destination.previous_secrets if p.until_ms > at]
    if len(live) == len(destination.previous_secrets):
        return destination
    return destination.model_copy(update={"previous_secrets": live})
