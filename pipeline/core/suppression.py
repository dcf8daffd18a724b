"""Suppression after a deletion request. Pure logic.

A deletion request for user U at time T (``pipeline delete-user``) means: from now on no call of
U *received before T* reaches a receiver, wherever it still waits (the deliveries topic, a retry
tier, a dead letter replayed later, a ``pipeline replay`` of an older range). Such a delivery is
*suppressed*: recorded as such in the delivery log and counted, never attempted. Calls U makes
after T are delivered as usual (the user may come back), and so are ``delete`` calls, whenever
they were received: they are the request's own notifications.

The delivery handler asks ``suppressed_by`` only while at least one deletion is known, so without
deletion requests the check costs one truthiness test per record, and with them one dict look-up.

    >>> from pipeline.core.records import Delivery
    >>> d = Delivery("m", "hooks", "web", "track", b"{}", received_at=5, user_id="u1")
    >>> suppressed_by(d, {"u1": 9}), suppressed_by(d, {"u1": 5}), suppressed_by(d, {"u2": 9})
    (9, None, None)
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson

from pipeline.core.calls import CallType
from pipeline.core.records import DeletionRequest, Delivery

__all__ = ["deleted_at", "suppressed_by", "SUPPRESSED_REASON"]

#: The ``reason`` of a ``suppressed`` log entry.
SUPPRESSED_REASON = "deletion_request"

_DELETE = CallType.DELETE.value


def deleted_at(request: DeletionRequest) -> int | None:
    """When the user was last asked to be deleted (epoch ms); ``None`` for an empty history.

    The latest request counts: a call received between two requests was made after the first
    (the user came back) and before the second, which covers it."""
    return max((event.requested_at for event in request.requests), default=None)


def suppressed_by(delivery: Delivery, deleted: Mapping[str, int]) -> int | None:
    """The deletion request (its time, epoch ms) that suppresses ``delivery``, if any:
    ``deleted`` maps user ids to their latest deletion request."""
    user = delivery.user_id
    if user is None:  # written before deliveries carried the user: the body names it
        user = _user_in_body(delivery.body)
    if not user:
        return None
    at = deleted.get(user)
    if at is None or delivery.received_at >= at or delivery.call_type == _DELETE:
        return None
    return at


def _user_in_body(body: bytes) -> str | None:
    try:
        user = orjson.loads(body).get("userId")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return user if isinstance(user, str) else None
