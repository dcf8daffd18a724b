"""Unit tests for pipeline.core.calls: the seven call types and their rules (seed §2.3, §8)."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest

from pipeline import CallTooLarge, InvalidCall
from pipeline.core.calls import (
    MAX_BATCH_BYTES,
    MAX_CALL_BYTES,
    MAX_ID_CHARS,
    Call,
    CallType,
    parse_call,
)
from pipeline.core.timestamps import parse_timestamp

RECEIVED = 1_795_273_470_123  # 2026-11-21T15:04:30.123Z


def parse(raw: Any, **kwargs: Any) -> Call:
    kwargs.setdefault("source_id", "web")
    kwargs.setdefault("received_at", RECEIVED)
    return parse_call(raw, **kwargs)


def invalid(raw: Any, **kwargs: Any) -> InvalidCall:
    with pytest.raises(InvalidCall) as info:
        parse(raw, **kwargs)
    return info.value


def test_limits_follow_the_seed() -> None:
    assert MAX_CALL_BYTES == 32 * 1024
    assert MAX_BATCH_BYTES >= 500_000
    assert [t.value for t in CallType] == [
        "identify",
        "track",
        "page",
        "screen",
        "group",
        "alias",
        "delete",
    ]


# ---- required fields per type (seed §2.3) ----------------------------------------------------------

VALID = [
    {"type": "track", "event": "Signed Up", "userId": "u1"},
    {"type": "track", "event": "Signed Up", "anonymousId": "a1"},
    {"type": "identify", "userId": "u1"},
    {"type": "identify", "anonymousId": "a1"},
    {"type": "page", "userId": "u1"},
    {"type": "page", "anonymousId": "a1"},
    {"type": "screen", "userId": "u1"},
    {"type": "screen", "anonymousId": "a1"},
    {"type": "group", "groupId": "g1", "userId": "u1"},
    {"type": "group", "groupId": "g1", "anonymousId": "a1"},
    {"type": "alias", "userId": "u2", "previousId": "u1"},
    {"type": "delete", "userId": "u1"},
]


@pytest.mark.parametrize("raw", VALID, ids=lambda r: "-".join(sorted(r)) + "-" + r["type"])
def test_minimal_valid_calls(raw: dict[str, Any]) -> None:
    call = parse(raw)
    assert call.type == CallType(raw["type"])
    assert call.type is CallType(raw["type"])
    assert call.user_id == raw.get("userId")
    assert call.anonymous_id == raw.get("anonymousId")
    assert call.source_id == "web"
    assert call.received_at == RECEIVED


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"type": "track", "userId": "u1"}, "event"),
        ({"type": "track", "event": "", "userId": "u1"}, "event"),
        ({"type": "track", "event": "E"}, "userId"),
        ({"type": "track", "event": "E", "userId": "", "anonymousId": ""}, "userId"),
        ({"type": "identify"}, "userId"),
        ({"type": "identify", "traits": {"a": 1}}, "userId"),
        ({"type": "page", "properties": {"path": "/"}}, "userId"),
        ({"type": "screen", "name": "Home"}, "userId"),
        ({"type": "group", "userId": "u1"}, "groupId"),
        ({"type": "group", "groupId": "", "userId": "u1"}, "groupId"),
        ({"type": "group", "groupId": "g1"}, "userId"),
        ({"type": "alias", "previousId": "u1"}, "userId"),
        ({"type": "alias", "anonymousId": "a1", "previousId": "u1"}, "userId"),
        ({"type": "alias", "userId": "u2"}, "previousId"),
        ({"type": "delete"}, "userId"),
        ({"type": "delete", "anonymousId": "a1"}, "userId"),
    ],
)
def test_missing_required_field(raw: dict[str, Any], field: str) -> None:
    error = invalid(raw)
    assert error.field == field
    assert not isinstance(error, CallTooLarge)
    assert str(error).startswith(f"{field}: ")


def test_type_is_required_and_must_be_known() -> None:
    assert invalid({"userId": "u1"}).field == "type"
    error = invalid({"type": "purchase", "userId": "u1"})
    assert error.field == "type"
    assert "'purchase'" in str(error)
    assert invalid({"type": "Track", "event": "E", "userId": "u1"}).field == "type"


def test_call_type_argument_overrides_the_body() -> None:
    # the /v1/track style endpoints give the type in the path
    call = parse({"event": "E", "userId": "u1"}, call_type="track")
    assert call.type is CallType.TRACK
    call = parse({"type": "identify", "event": "E", "userId": "u1"}, call_type="track")
    assert call.type is CallType.TRACK
    assert parse({"type": "track", "userId": "u1"}, call_type="identify").type is CallType.IDENTIFY


@pytest.mark.parametrize("raw", [None, [], "track", 5, [{"type": "track"}]])
def test_call_must_be_an_object(raw: Any) -> None:
    assert invalid(raw).field == "call"


# ---- types of fields -------------------------------------------------------------------------------

TRACK = {"type": "track", "event": "E", "userId": "u1"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("userId", True),
        ("userId", 1.5),
        ("userId", ["u"]),
        ("userId", {"id": "u"}),
        ("anonymousId", False),
        ("anonymousId", 2.0),
        ("messageId", ["m"]),
        ("messageId", 1.0),
        ("event", 5),
        ("event", ["E"]),
        ("event", True),
        ("name", 5),
        ("category", {"a": 1}),
        ("groupId", [1]),
        ("previousId", True),
        ("properties", []),
        ("properties", "a=b"),
        ("properties", 5),
        ("traits", [1, 2]),
        ("traits", "x"),
        ("context", "ctx"),
        ("context", 1),
        ("integrations", []),
        ("integrations", True),
        ("integrations", "Webhooks"),
        ("timestamp", 1795273470123),
        ("timestamp", {"t": 1}),
        ("timestamp", "yesterday"),
        ("timestamp", "2026-13-01T00:00:00Z"),
        ("sentAt", 17),
        ("sentAt", "not a time"),
    ],
)
def test_wrong_type_names_the_field(field: str, value: Any) -> None:
    error = invalid({**TRACK, field: value})
    assert error.field == field
    assert type(error) is InvalidCall


def test_bad_timestamp_message_names_the_value() -> None:
    error = invalid({**TRACK, "timestamp": "yesterday"})
    assert "'yesterday'" in error.message


@pytest.mark.parametrize("value", ["on", 1, 0, None, [], "true"])
def test_integrations_values_must_be_bool_or_object(value: Any) -> None:
    error = invalid({**TRACK, "integrations": {"All": False, "Webhooks": value}})
    assert error.field == "integrations.Webhooks"


def test_integrations_bool_and_object_values_are_kept() -> None:
    integrations = {"All": False, "Webhooks": True, "Other": {"option": 1}, "Off": False}
    call = parse({**TRACK, "integrations": integrations})
    assert call.integrations is not None
    assert orjson.loads(call.integrations) == integrations


# ---- identifiers -----------------------------------------------------------------------------------


def test_integer_ids_become_strings() -> None:
    call = parse({"type": "group", "userId": 42, "anonymousId": 7, "groupId": 0, "messageId": 99})
    assert (call.user_id, call.anonymous_id, call.group_id, call.message_id) == (
        "42",
        "7",
        "0",
        "99",
    )
    alias = parse({"type": "alias", "userId": 2, "previousId": 1})
    assert (alias.user_id, alias.previous_id) == ("2", "1")
    assert parse({"type": "identify", "userId": -5}).user_id == "-5"


def test_empty_ids_count_as_missing() -> None:
    call = parse({"type": "identify", "userId": "", "anonymousId": "a1"})
    assert call.user_id is None
    assert call.anonymous_id == "a1"


def test_id_length_limit() -> None:
    assert parse({"type": "identify", "userId": "u" * MAX_ID_CHARS}).user_id == "u" * MAX_ID_CHARS
    error = invalid({"type": "identify", "userId": "u" * (MAX_ID_CHARS + 1)})
    assert error.field == "userId"


def test_message_id_is_kept_or_generated() -> None:
    assert parse({**TRACK, "messageId": "m-1"}).message_id == "m-1"
    first = parse(TRACK).message_id
    second = parse(TRACK).message_id
    assert first != second
    assert str(uuid.UUID(first)) == first
    assert parse({**TRACK, "messageId": ""}).message_id not in ("", None)
    assert parse({**TRACK, "messageId": None}).message_id


def test_key_is_user_then_anonymous_then_message_id() -> None:
    assert parse({**TRACK, "anonymousId": "a1"}).key == b"u1"
    assert parse({"type": "track", "event": "E", "anonymousId": "a1"}).key == b"a1"
    call = parse({"type": "identify", "userId": "ü"})
    assert call.key == "ü".encode()


# ---- timestamps ------------------------------------------------------------------------------------


def test_timestamp_defaults_to_received_at() -> None:
    call = parse(TRACK)
    assert call.timestamp == RECEIVED
    assert call.sent_at is None
    assert parse({**TRACK, "timestamp": ""}).timestamp == RECEIVED
    assert parse({**TRACK, "timestamp": None}).timestamp == RECEIVED


def test_timestamp_and_sent_at_are_parsed() -> None:
    call = parse(
        {**TRACK, "timestamp": "2026-11-20T23:04:30.123-0800", "sentAt": "2026-11-21T07:05:00Z"}
    )
    assert call.timestamp == parse_timestamp("2026-11-21T07:04:30.123Z")
    assert call.sent_at == parse_timestamp("2026-11-21T07:05:00.000Z")
    assert call.received_at == RECEIVED


# ---- free-form objects ------------------------------------------------------------------------------


def test_objects_are_kept_as_compact_json_text() -> None:
    call = parse(
        {
            "type": "identify",
            "userId": "u1",
            "traits": {"name": "Zoë", "plan": "pro", "seats": 3, "nested": {"a": [1, 2.5, None]}},
            "context": {"ip": "203.0.113.7", "locale": "de-DE"},
        }
    )
    assert call.traits == '{"name":"Zoë","plan":"pro","seats":3,"nested":{"a":[1,2.5,null]}}'
    assert call.context == '{"ip":"203.0.113.7","locale":"de-DE"}'
    assert call.properties is None
    assert call.integrations is None


def test_empty_objects_are_kept() -> None:
    call = parse({**TRACK, "properties": {}})
    assert call.properties == "{}"


def test_all_fields_of_a_page_call() -> None:
    raw = {
        "type": "page",
        "userId": "u1",
        "anonymousId": "a1",
        "messageId": "m1",
        "name": "Pricing",
        "category": "Docs",
        "properties": {"path": "/pricing", "url": "https://example.com/pricing"},
        "context": {"ip": "1.2.3.4"},
        "integrations": {"All": True},
        "timestamp": "2026-11-21T07:04:30.123Z",
    }
    call = parse(raw, source_id="src-9")
    assert call == Call(
        type=CallType.PAGE,
        message_id="m1",
        source_id="src-9",
        timestamp=parse_timestamp("2026-11-21T07:04:30.123Z"),
        received_at=RECEIVED,
        user_id="u1",
        anonymous_id="a1",
        name="Pricing",
        category="Docs",
        properties='{"path":"/pricing","url":"https://example.com/pricing"}',
        context='{"ip":"1.2.3.4"}',
        integrations='{"All":true}',
    )


def test_unknown_top_level_keys_are_ignored() -> None:
    call = parse(
        {
            **TRACK,
            "channel": "server",
            "library": {"name": "analytics-go", "version": "2.0"},
            "_metadata": {"bundled": []},
            "version": 2,
            "writeKey": "wk",
            "whatever": [1, 2, 3],
        }
    )
    assert call.event == "E"
    assert call.properties is None


def test_call_is_immutable() -> None:
    call = parse(TRACK)
    with pytest.raises(AttributeError):
        call.user_id = "other"  # type: ignore[misc]


def test_python_values_that_are_not_json_are_rejected_as_invalid_call() -> None:
    error = invalid({**TRACK, "properties": {"tags": {"a", "b"}}})
    assert error.field == "properties"


@pytest.mark.parametrize(
    "properties",
    [{1: "non-string key"}, {"n": 2**70}],
    ids=["non-string-key", "int-over-64-bit"],
)
def test_unencodable_properties_raise_invalid_call_not_type_error(properties: Any) -> None:
    # parse_call promises InvalidCall naming the field; a Python caller can pass such dicts.
    error = invalid({**TRACK, "properties": properties})
    assert error.field == "properties"


# ---- size limit (seed §8: 32 KB per call) ---------------------------------------------------------


def _call_of_size(size: int) -> dict[str, Any]:
    raw = {**TRACK, "properties": {"pad": ""}}
    base = len(orjson.dumps(raw))
    raw["properties"] = {"pad": "x" * (size - base)}
    assert len(orjson.dumps(raw)) == size
    return raw


def test_call_of_exactly_32_kb_is_accepted() -> None:
    call = parse(_call_of_size(MAX_CALL_BYTES))
    assert call.properties is not None


def test_call_over_32_kb_is_too_large() -> None:
    with pytest.raises(CallTooLarge) as info:
        parse(_call_of_size(MAX_CALL_BYTES + 1))
    error = info.value
    assert isinstance(error, InvalidCall)
    assert error.field == "call"
    assert error.size == MAX_CALL_BYTES + 1
    assert error.limit == MAX_CALL_BYTES


def test_size_is_counted_in_utf8_bytes() -> None:
    # 11,000 three-byte characters: 33,000 bytes although only 11,000 characters
    with pytest.raises(CallTooLarge):
        parse({**TRACK, "properties": {"text": "€" * 11_000}})


def test_raw_size_given_by_the_caller_wins() -> None:
    with pytest.raises(CallTooLarge) as info:
        parse(TRACK, raw_size=MAX_CALL_BYTES + 100)
    assert info.value.size == MAX_CALL_BYTES + 100
    assert parse(_call_of_size(MAX_CALL_BYTES + 10), raw_size=100).event == "E"


def test_size_is_checked_before_the_fields() -> None:
    big = {"type": "nope", "properties": {"pad": "x" * MAX_CALL_BYTES}}
    with pytest.raises(CallTooLarge):
        parse(big)


# ---- message ids -----------------------------------------------------------------------------


def test_generated_message_ids_are_version_4_uuids() -> None:
    from pipeline.core.calls import new_message_id

    for _ in range(600):  # more than one batch
        text = new_message_id()
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, text)


def test_generated_message_ids_are_unique_across_threads() -> None:
    import threading

    from pipeline.core.calls import new_message_id

    seen: list[list[str]] = [[] for _ in range(4)]

    def make(out: list[str]) -> None:
        out.extend(new_message_id() for _ in range(5000))

    threads = [threading.Thread(target=make, args=(out,)) for out in seen]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [text for out in seen for text in out]
    assert len(set(every)) == len(every) == 20000


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    import os

    from pipeline.core.calls import new_message_id

    new_message_id()  # a batch is now half used in the parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: write its next ids and leave at once
        os.write(write, ",".join(new_message_id() for _ in range(10)).encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        child = set(pipe.read().split(","))
    parent = {new_message_id() for _ in range(10)}
    assert len(child) == 10
    assert not child & parent
