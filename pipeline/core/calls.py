"""The call model: Segment's seven call types, validated.

A call reaches us as a JSON object in Segment's shape (``userId``, ``anonymousId``, ``messageId``,
``timestamp``, ``context``, ``integrations``, ``event``, ``properties``, ``traits``, ``name``,
``category``, ``groupId``, ``previousId``). ``parse_call`` checks it against the rules of the seed
(§2.3) and returns a ``Call``. Free-form objects (properties, traits, context, integrations) are kept
as compact JSON text: they travel that way inside the Avro record and are spliced into the webhook
body as they are, never parsed again.

Unknown top-level keys are ignored, as Segment does: libraries send ``channel``, ``library``,
``_metadata``, ``version`` and others that mean nothing to a webhook.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import orjson

from pipeline.core.exceptions import CallTooLarge, InvalidCall
from pipeline.core.timestamps import parse_timestamp

__all__ = [
    "CallType",
    "Call",
    "parse_call",
    "new_message_id",
    "MAX_CALL_BYTES",
    "MAX_BATCH_BYTES",
    "json_text",
    "json_kind",
    "unencodable_field",
]

#: Seed §8: 32 KB maximum per call.
MAX_CALL_BYTES = 32 * 1024
#: Seed §8: 500 KB maximum per batch request (Segment counts 500,000 + 12,000 bytes of framing).
MAX_BATCH_BYTES = 512_000
#: The longest identifier we accept (user, anonymous, group, message id, event name).
MAX_ID_CHARS = 1024


class CallType(enum.StrEnum):
    """The seven call types (seed §1, §6)."""

    IDENTIFY = "identify"
    TRACK = "track"
    PAGE = "page"
    SCREEN = "screen"
    GROUP = "group"
    ALIAS = "alias"
    DELETE = "delete"


_CALL_TYPES = {kind.value: kind for kind in CallType}


#: Message ids are made 256 at a time from one read of the OS's random source; a list iterator
#: hands them out (``next`` on it is atomic, so threads never share one), and a forked child
#: starts a fresh batch.
_ID_BATCH = 256
_ids: Iterator[str] = iter(())
#: The RFC 9562 variant nibble (10xx) for any random hex digit.
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


def _id_batch() -> Iterator[str]:
    h = os.urandom(16 * _ID_BATCH).hex()
    variant = _VARIANT
    return iter(
        [
            f"{h[i : i + 8]}-{h[i + 8 : i + 12]}-4{h[i + 13 : i + 16]}-"
            f"{variant[h[i + 16]]}{h[i + 17 : i + 20]}-{h[i + 20 : i + 32]}"
            for i in range(0, 32 * _ID_BATCH, 32)
        ]
    )


def new_message_id() -> str:
    """A random (version 4) UUID from the OS's random source, in a third of the time of
    ``str(uuid.uuid4())``."""
    global _ids
    try:
        return next(_ids)
    except StopIteration:
        _ids = _id_batch()
        return next(_ids)


def _forget_ids() -> None:
    global _ids
    _ids = iter(())


os.register_at_fork(after_in_child=_forget_ids)


class Call(NamedTuple):
    """One validated call. Times are epoch milliseconds; free-form objects are JSON text.

    A ``NamedTuple`` rather than a frozen dataclass: just as immutable, and built in a third of
    the time (1.3 µs instead of 3.6 µs for 17 fields), which matters once per call on every path.
    """

    type: CallType
    message_id: str
    source_id: str
    timestamp: int
    received_at: int
    user_id: str | None = None
    anonymous_id: str | None = None
    sent_at: int | None = None
    event: str | None = None
    name: str | None = None
    category: str | None = None
    group_id: str | None = None
    previous_id: str | None = None
    properties: str | None = None
    traits: str | None = None
    context: str | None = None
    integrations: str | None = None

    @property
    def key(self) -> bytes:
        """The Kafka key: ``userId``, else ``anonymousId``, so one user's calls stay in order."""
        return (self.user_id or self.anonymous_id or self.message_id).encode()


def _new_call(fields: tuple[Any, ...]) -> Call:
    """A ``Call`` from all its fields in order: a quarter of the cost of ``Call(**fields)``."""
    return tuple.__new__(Call, fields)


def json_text(value: Mapping[str, Any]) -> str:
    """Compact JSON text, non-ASCII kept as it is (the ``JSON.stringify`` form)."""
    return orjson.dumps(value).decode()


def _identifier(value: object, field: str) -> str | None:
    """A non-empty string id; integers are accepted and turned into strings, as Segment does."""
    if type(value) is str:
        text = value
    elif isinstance(value, str | int) and not isinstance(value, bool):
        text = str(value)
    else:
        raise InvalidCall(field, f"must be a string, got {json_kind(value)}")
    if len(text) > MAX_ID_CHARS:
        raise InvalidCall(field, f"is {len(text)} characters, over the limit of {MAX_ID_CHARS}")
    return text or None


def _string(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidCall(field, f"must be a string, got {json_kind(value)}")
    return value


def _object(value: object, field: str) -> str:
    if not isinstance(value, dict):
        raise InvalidCall(field, f"must be a JSON object, got {json_kind(value)}")
    try:
        return json_text(value)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise InvalidCall(field, f"cannot be encoded as JSON: {exc}") from None


def _integrations(value: object) -> str:
    if not isinstance(value, dict):
        raise InvalidCall("integrations", f"must be a JSON object, got {json_kind(value)}")
    for key, setting in value.items():
        if not isinstance(setting, bool | dict):
            raise InvalidCall(
                f"integrations.{key}",
                f"must be true, false or an object of options, got {json_kind(setting)}",
            )
    return _object(value, "integrations")


def _time(value: object, field: str) -> int | None:
    if value == "":
        return None
    if not isinstance(value, str):
        raise InvalidCall(field, f"must be an ISO 8601 string, got {json_kind(value)}")
    try:
        return parse_timestamp(value)
    except ValueError as exc:
        raise InvalidCall(field, str(exc)) from None


def json_kind(value: object) -> str:
    """How a JSON value's type reads in an error message: "a string", "an array", ..."""
    match value:
        case None:
            return "null"
        case bool():
            return "a boolean"
        case int() | float():
            return "a number"
        case str():
            return "a string"
        case list():
            return "an array"
        case dict():
            return "an object"
    return type(value).__name__


def parse_call(
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

    # Written out field by field: this runs for every call on every path (the ingestion API,
    # the client library), and most fields are absent; a helper runs only for a present one.
    get = raw.get
    user_id = get("userId")
    if user_id is not None:
        user_id = _identifier(user_id, "userId")
    anonymous_id = get("anonymousId")
    if anonymous_id is not None:
        anonymous_id = _identifier(anonymous_id, "anonymousId")
    timestamp = get("timestamp")
    if timestamp is not None:
        timestamp = _time(timestamp, "timestamp")
    message_id = get("messageId")
    if message_id is not None:
        message_id = _identifier(message_id, "messageId")
    sent_at = get("sentAt")
    if sent_at is not None:
        sent_at = _time(sent_at, "sentAt")
    event = get("event")
    if event is not None:
        event = _string(event, "event")
    name = get("name")
    if name is not None:
        name = _string(name, "name")
    category = get("category")
    if category is not None:
        category = _string(category, "category")
    group_id = get("groupId")
    if group_id is not None:
        group_id = _identifier(group_id, "groupId")
    previous_id = get("previousId")
    if previous_id is not None:
        previous_id = _identifier(previous_id, "previousId")
    properties = get("properties")
    if properties is not None:
        properties = _object(properties, "properties")
    traits = get("traits")
    if traits is not None:
        traits = _object(traits, "traits")
    context = get("context")
    if context is not None:
        context = _object(context, "context")
    integrations = get("integrations")
    if integrations is not None:
        integrations = _integrations(integrations)
    call = _new_call(
        (
            kind,
            message_id or new_message_id(),
            source_id,
            received_at if timestamp is None else timestamp,
            received_at,
            user_id,
            anonymous_id,
            sent_at,
            event,
            name,
            category,
            group_id,
            previous_id,
            properties,
            traits,
            context,
            integrations,
        )
    )
    _check_required(call)
    return call


def unencodable_field(raw: dict[str, Any]) -> str:
    """The top-level field whose value JSON cannot encode (non-string keys, huge integers)."""
    for key, value in raw.items():
        try:
            orjson.dumps({key: value})
        except (TypeError, orjson.JSONEncodeError):
            return str(key)
    return "call"


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
