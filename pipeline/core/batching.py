"""A batch's request: its body and its id (``batch`` in a destination's config; gathered by
``pipeline.roles.batches``, and the console's test event for a batching destination)."""

from __future__ import annotations

import secrets
from collections.abc import Sequence

__all__ = ["batch_body", "batch_id", "batch_label"]


def batch_body(bodies: Sequence[bytes]) -> bytes:
    """The request body of a batch: the JSON array of its calls' bodies (each a JSON object).

    >>> batch_body([b'{"a":1}', b'{"b":2}'])
    b'[{"a":1},{"b":2}]'
    """
    return b"[" + b",".join(bodies) + b"]"


def batch_id() -> str:
    """A new batch's id: its request's ``webhook-id`` and its name in the delivery log."""
    return f"batch_{secrets.token_hex(10)}"


def batch_label(ident: str, calls: int) -> str:
    """What each call's attempt entry in the delivery log says of its batch."""
    return f"{ident} of {calls} call{'s' if calls != 1 else ''}"
