"""Turning a call method's arguments into a Segment-format message, validated and encoded.

The rules are the server's: every message goes through ``pipeline.core.calls.parse_call``, so a call
the client accepts is a call the ingestion API accepts, and the client refuses at once (with the
field named) what the API would refuse later.

A queued message is kept twice, both made once at call time: its compact JSON (what the HTTP
transport sends, so a retry sends the same bytes) and the validated ``Call`` (what the Kafka
transport writes). Both are snapshots: changing a ``properties`` dict after ``track()`` returned
changes nothing that is sent.
"""

from __future__ import annotations

import decimal
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from pipeline.core.calls import Call, new_message_id, parse_call, unencodable_field
from pipeline.core.exceptions import InvalidCall
from pipeline.core.timestamps import format_timestamp, now_ms

from ._trace_context import TraceContext, current_trace

__all__ = ["Queued", "build_message", "prepare", "LIBRARY"]

#: ``context.library`` of every message (the receiver sees which library sent a call).
LIBRARY = {"name": "pipeline-python", "version": "0.1.0"}
#: ``source_id`` used for validation when the transport does not know the source (HTTP: the
#: server resolves the write key).
UNRESOLVED_SOURCE = "-"


class Queued:
    """One message waiting in the queue: its JSON, and (Kafka transport) its ``Call``.

    The HTTP transport sends only the bytes, so its queue holds no ``Call`` objects: less memory,
    less garbage-collector work per call. ``call`` rebuilds one on demand from the bytes.
    """

    __slots__ = ("encoded", "_call", "event_time", "source_id", "trace")

    def __init__(
        self,
        encoded: bytes,
        call: Call | None,
        event_time: int,
        source_id: str,
        trace: TraceContext = (),
    ) -> None:
        self.encoded = encoded
        self._call = call
        self.event_time = event_time
        self.source_id = source_id
        #: The trace context of the span that made the call (``_trace_context``).
        self.trace = trace

    @property
    def call(self) -> Call:
        if self._call is not None:
            return self._call
        return parse_call(
            orjson.loads(self.encoded),
            source_id=self.source_id,
            received_at=self.event_time,
            raw_size=len(self.encoded),
        )

    @property
    def size(self) -> int:
        return len(self.encoded)

    def message(self) -> dict[str, Any]:
        value: dict[str, Any] = orjson.loads(self.encoded)
        return value


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)


def _timestamp(value: datetime | str | None, field: str = "timestamp") -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, datetime):
        # A naive datetime is local time, as everywhere in Python (datetime.astimezone).
        return format_timestamp((value.astimezone(UTC) - _EPOCH) // _ONE_MS)
    raise InvalidCall(
        field, f"must be a datetime or an ISO 8601 string, got {type(value).__name__}"
    )


def build_message(
    call_type: str,
    now: int | None = None,
    *,
    user_id: str | int | None = None,
    anonymous_id: str | int | None = None,
    event: str | None = None,
    properties: Mapping[str, Any] | None = None,
    traits: Mapping[str, Any] | None = None,
    context: Mapping[str, Any] | None = None,
    integrations: Mapping[str, Any] | None = None,
    timestamp: datetime | str | None = None,
    message_id: str | None = None,
    name: str | None = None,
    category: str | None = None,
    group_id: str | int | None = None,
    previous_id: str | int | None = None,
) -> dict[str, Any]:
    """The message in Segment's format (camelCase keys, only the fields given), made at ``now``
    (epoch ms; default: now).

    Without ``timestamp`` the call time goes out as ``originalTimestamp``: the server turns it into
    ``timestamp`` correcting for clock skew (Segment's rule), so batching does not shift the time a
    receiver sees. ``timestamp`` itself is for historical import (seed §4.3 rule 8).
    """
    message: dict[str, Any] = {
        "type": call_type,
        "messageId": message_id if message_id is not None else new_message_id(),
    }
    # One test per field rather than a loop over pairs: this runs once per call, in the caller's
    # thread.
    if user_id is not None:
        message["userId"] = user_id
    if anonymous_id is not None:
        message["anonymousId"] = anonymous_id
    if event is not None:
        message["event"] = event
    if name is not None:
        message["name"] = name
    if category is not None:
        message["category"] = category
    if group_id is not None:
        message["groupId"] = group_id
    if previous_id is not None:
        message["previousId"] = previous_id
    if properties is not None:
        message["properties"] = properties
    if traits is not None:
        message["traits"] = traits
    if integrations is not None:
        message["integrations"] = integrations
    if timestamp is not None:
        message["timestamp"] = _timestamp(timestamp)
    else:
        message["originalTimestamp"] = format_timestamp(now_ms() if now is None else now)
    if context is None:
        message["context"] = {"library": LIBRARY}
    elif isinstance(context, Mapping) and "library" not in context:
        message["context"] = {**context, "library": LIBRARY}
    else:
        message["context"] = context
    return message


def _default(value: object) -> object:
    """What orjson cannot encode by itself but a JSON call can hold."""
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, set | frozenset):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def prepare(
    message: dict[str, Any],
    *,
    event_time: int,
    source_id: str = UNRESOLVED_SOURCE,
    keep_call: bool = True,
) -> Queued:
    """Validate and encode one message; raises ``InvalidCall`` naming the field, or
    ``CallTooLarge``. ``event_time`` (epoch ms) is when the call was made: the ``Call``'s
    ``timestamp`` unless the message has its own. The active OpenTelemetry span's context, if
    any, goes with it."""
    try:
        encoded = orjson.dumps(message)
    except TypeError as plain:
        try:
            encoded = orjson.dumps(message, default=_default)
        except TypeError:  # named as parse_call names it (the first error, the field)
            raise InvalidCall(
                unencodable_field(message), f"cannot be encoded as JSON: {plain}"
            ) from None
        message = orjson.loads(encoded)
    call = parse_call(  # refuses a call over 32 KB (CallTooLarge), as the API does
        message, source_id=source_id, received_at=event_time, raw_size=len(encoded)
    )
    return Queued(encoded, call if keep_call else None, event_time, source_id, current_trace())
