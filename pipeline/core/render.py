"""The webhook body (seed §2.2), rendered once per call by the router.

The body is compact UTF-8 JSON in ``JSON.stringify`` form: no spaces, non-ASCII characters as they
are. Field order is fixed: ``version``, ``type``, ``userId``, ``anonymousId``, ``messageId``,
``timestamp``, then the fields of the type, then ``context``. Free-form objects are already compact
JSON text in the call record and are spliced in without being parsed again.

Per type, beyond the common fields:

    page      properties (path, referrer, title, url and any others), name, category if given
    screen    name and properties if given, context
    identify  traits
    track     event, properties
    alias     "Previous ID", "User ID"   (the keys contain spaces, as the seed writes them)
    group     groupId, traits
    delete    nothing: exactly type, userId, timestamp
"""

from __future__ import annotations

import orjson

from pipeline.core.calls import Call, CallType
from pipeline.core.timestamps import format_timestamp

__all__ = ["render_body", "WEBHOOK_VERSION"]

#: Seed §9.2: every body but delete carries ``"version": 1``.
WEBHOOK_VERSION = 1
_EMPTY = "{}"


def _s(value: str | None) -> bytes:
    return orjson.dumps(value)


def render_body(call: Call) -> bytes:
    """The exact bytes POSTed to every webhook of every destination for this call."""
    timestamp = _s(format_timestamp(call.timestamp))
    if call.type is CallType.DELETE:
        return (
            b'{"type":"delete","userId":' + _s(call.user_id) + b',"timestamp":' + timestamp + b"}"
        )

    parts = [
        b'{"version":1,"type":"',
        call.type.value.encode(),
        b'","userId":',
        _s(call.user_id),
    ]
    if call.anonymous_id is not None:
        parts += [b',"anonymousId":', _s(call.anonymous_id)]
    parts += [b',"messageId":', _s(call.message_id), b',"timestamp":', timestamp]

    match call.type:
        case CallType.TRACK:
            parts += [b',"event":', _s(call.event), b',"properties":', _obj(call.properties)]
        case CallType.PAGE:
            parts += [b',"properties":', _obj(call.properties)]
            if call.name is not None:
                parts += [b',"name":', _s(call.name)]
            if call.category is not None:
                parts += [b',"category":', _s(call.category)]
        case CallType.SCREEN:
            if call.name is not None:
                parts += [b',"name":', _s(call.name)]
            if call.properties is not None:
                parts += [b',"properties":', _obj(call.properties)]
        case CallType.IDENTIFY:
            parts += [b',"traits":', _obj(call.traits)]
        case CallType.GROUP:
            parts += [b',"groupId":', _s(call.group_id), b',"traits":', _obj(call.traits)]
        case CallType.ALIAS:
            parts += [b',"Previous ID":', _s(call.previous_id), b',"User ID":', _s(call.user_id)]

    if call.context is not None:
        parts += [b',"context":', call.context.encode()]
    parts.append(b"}")
    return b"".join(parts)


def _obj(text: str | None) -> bytes:
    return (text or _EMPTY).encode()
