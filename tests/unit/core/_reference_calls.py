"""The first ``parse_call`` (before its fast path), kept as an oracle: the fast one must agree
with it on every input (tests/unit/test_calls_oracle.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from pipeline.core.calls import (
    _CALL_TYPES,
    MAX_CALL_BYTES,
    MAX_ID_CHARS,
    Call,
    CallType,
    json_kind,
    json_text,
    new_message_id,
    unencodable_field,
)
from pipeline.core.exceptions import CallTooLarge, InvalidCall
from pipeline.core.timestamps import parse_timestamp


def _identifier(raw: Mapping[str, Any], field: str) -> str | None:
    """A non-empty string id; integers are accepted and turned into strings, as Segment does."""
    value = raw.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidCall(field, f"must be a string, got {json_kind(value)}")
    text = str(value)
    if len(text) > MAX_ID_CHARS:
        raise InvalidCall(field, f"is {len(text)} characters, over the limit of {MAX_ID_CHARS}")
    return text or None


def _string(raw: Mapping[str, Any], field: str) -> str | None:
    value = raw.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidCall(field, f"must be a string, got {json_kind(value)}")
    return value


def _object(raw: Mapping[str, Any], field: str) -> str | None:
    value = raw.get(field)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidCall(field, f"must be a JSON object, got {json_kind(value)}")
    try:
        return json_text(value)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise InvalidCall(field, f"cannot be encoded as JSON: {exc}") from None


def _integrations(raw: Mapping[str, Any]) -> str | None:
    value = raw.get("integrations")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidCall("integrations", f"must be a JSON object, got {json_kind(value)}")
    for key, setting in value.items():
        if not isinstance(setting, bool | dict):
            raise InvalidCall(
                f"integrations.{key}",
                f"must be true, false or an object of options, got {json_kind(setting)}",
            )
    return json_text(value)


def _time(raw: Mapping[str, Any], field: str) -> int | None:
    value = raw.get(field)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidCall(field, f"must be an ISO 8601 string, got {json_kind(value)}")
    try:
        return parse_timestamp(value)
    except ValueError as exc:
        raise InvalidCall(field, str(exc)) from None


def reference_parse_call(
    raw: object,
    *,
    source_id: str,
    received_at: int,
    call_type: str | None = None,
    raw_size: int | None = None,
) -> Call:
    """Validate one Segment-format call and return it as a ``Call``.

    ``call_type`` overrides ``raw["type"]`` (the ``/v1/track`` style endpoints). ``raw_size`` is the
    size in bytes of the call's JSON as received; when absent it is measured here.
    Raises ``InvalidCall`` naming the field, or ``CallTooLarge``.
    """
    if not isinstance(raw, dict):
        raise InvalidCall("call", f"must be a JSON object, got {json_kind(raw)}")
    if raw_size is None:
        try:
            raw_size = len(orjson.dumps(raw))
        except (TypeError, orjson.JSONEncodeError) as exc:
            raise InvalidCall(unencodable_field(raw), f"cannot be encoded as JSON: {exc}") from None
    size = raw_size
    if size > MAX_CALL_BYTES:
        raise CallTooLarge("call", size, MAX_CALL_BYTES)

    type_text = call_type or raw.get("type")
    if type_text is None:
        raise InvalidCall("type", "is required: one of " + ", ".join(CallType))
    kind = _CALL_TYPES.get(type_text) if isinstance(type_text, str) else None
    if kind is None:
        raise InvalidCall(
            "type", f"{type_text!r} is not a call type; use one of " + ", ".join(CallType)
        )

    user_id = _identifier(raw, "userId")
    anonymous_id = _identifier(raw, "anonymousId")
    timestamp = _time(raw, "timestamp")
    call = Call(
        type=kind,
        message_id=_identifier(raw, "messageId") or new_message_id(),
        source_id=source_id,
        timestamp=received_at if timestamp is None else timestamp,
        received_at=received_at,
        user_id=user_id,
        anonymous_id=anonymous_id,
        sent_at=_time(raw, "sentAt"),
        event=_string(raw, "event"),
        name=_string(raw, "name"),
        category=_string(raw, "category"),
        group_id=_identifier(raw, "groupId"),
        previous_id=_identifier(raw, "previousId"),
        properties=_object(raw, "properties"),
        traits=_object(raw, "traits"),
        context=_object(raw, "context"),
        integrations=_integrations(raw),
    )
    _check_required(call)
    return call


def _check_required(call: Call) -> None:
    """The required fields of seed §2.3, per type."""
    match call.type:
        case CallType.TRACK:
            if not call.event:
                raise InvalidCall("event", "is required for a track call")
            _need_user(call)
        case CallType.GROUP:
            if not call.group_id:
                raise InvalidCall("groupId", "is required for a group call")
            _need_user(call)
        case CallType.ALIAS:
            if not call.user_id:
                raise InvalidCall("userId", "is required for an alias call (the new id)")
            if not call.previous_id:
                raise InvalidCall("previousId", "is required for an alias call (the old id)")
        case CallType.DELETE:
            if not call.user_id:
                raise InvalidCall("userId", "is required for a delete call")
        case _:
            _need_user(call)


def _need_user(call: Call) -> None:
    if not call.user_id and not call.anonymous_id:
        raise InvalidCall(
            "userId", f"a {call.type} call needs a userId or an anonymousId; neither was given"
        )
