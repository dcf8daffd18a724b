"""Unit tests for pipeline.core.render: the webhook body of every row of seed §2.2, byte for byte."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import Call, CallType, parse_call, render_body
from pipeline.core.render import WEBHOOK_VERSION
from pipeline.core.timestamps import parse_timestamp

TS_TEXT = "2026-11-21T07:04:30.123Z"
TS = parse_timestamp(TS_TEXT)
RECEIVED = TS + 456


def call(raw: dict[str, Any]) -> Call:
    return parse_call(raw, source_id="web", received_at=RECEIVED)


def body_of(raw: dict[str, Any]) -> bytes:
    return render_body(call({"timestamp": TS_TEXT, **raw}))


def keys(body: bytes) -> list[str]:
    return list(orjson.loads(body))


# ---- exact bytes, one or more per type -------------------------------------------------------------


def test_track_exact_bytes() -> None:
    body = body_of(
        {
            "type": "track",
            "userId": "u1",
            "messageId": "m-track",
            "event": "Order Completed",
            "properties": {"revenue": "9.99", "currency": "EUR"},
        }
    )
    assert body == (
        b'{"version":1,"type":"track","userId":"u1","messageId":"m-track",'
        b'"timestamp":"2026-11-21T07:04:30.123Z","event":"Order Completed",'
        b'"properties":{"revenue":"9.99","currency":"EUR"}}'
    )


def test_track_with_anonymous_id_and_context_exact_bytes() -> None:
    body = body_of(
        {
            "type": "track",
            "userId": "u1",
            "anonymousId": "anon-1",
            "messageId": "m-t2",
            "event": "Clicked",
            "properties": {"button": "buy"},
            "context": {"ip": "203.0.113.7"},
        }
    )
    assert body == (
        b'{"version":1,"type":"track","userId":"u1","anonymousId":"anon-1","messageId":"m-t2",'
        b'"timestamp":"2026-11-21T07:04:30.123Z","event":"Clicked","properties":{"button":"buy"},'
        b'"context":{"ip":"203.0.113.7"}}'
    )


def test_track_without_properties_has_an_empty_object() -> None:
    body = body_of({"type": "track", "userId": "u1", "messageId": "m", "event": "Ping"})
    assert body.endswith(b',"event":"Ping","properties":{}}')
    assert orjson.loads(body)["properties"] == {}


def test_page_exact_bytes() -> None:
    body = body_of(
        {
            "type": "page",
            "userId": "u1",
            "messageId": "m-page",
            "name": "Pricing",
            "properties": {
                "path": "/pricing",
                "referrer": "https://www.google.com/",
                "title": "Pricing – Acme",
                "url": "https://example.com/pricing?plan=pro",
                "plan": "pro",
            },
        }
    )
    assert (
        body
        == (
            '{"version":1,"type":"page","userId":"u1","messageId":"m-page",'
            '"timestamp":"2026-11-21T07:04:30.123Z","properties":{"path":"/pricing",'
            '"referrer":"https://www.google.com/","title":"Pricing – Acme",'
            '"url":"https://example.com/pricing?plan=pro","plan":"pro"},"name":"Pricing"}'
        ).encode()
    )
    props = orjson.loads(body)["properties"]
    assert all(isinstance(props[k], str) for k in ("path", "referrer", "title", "url"))


def test_page_with_category_and_without_name() -> None:
    body = body_of({"type": "page", "anonymousId": "a1", "messageId": "m", "category": "Docs"})
    assert body == (
        b'{"version":1,"type":"page","userId":null,"anonymousId":"a1","messageId":"m",'
        b'"timestamp":"2026-11-21T07:04:30.123Z","properties":{},"category":"Docs"}'
    )


def test_screen_exact_bytes() -> None:
    context = {
        "device": {"model": "iPhone15,2", "type": "ios"},
        "os": {"name": "iOS", "version": "17.1"},
        "app": {"build": "42", "name": "Shop", "version": "3.1.0"},
    }
    body = body_of(
        {
            "type": "screen",
            "userId": "u1",
            "messageId": "m-screen",
            "name": "Home",
            "context": context,
        }
    )
    assert body == (
        b'{"version":1,"type":"screen","userId":"u1","messageId":"m-screen",'
        b'"timestamp":"2026-11-21T07:04:30.123Z","name":"Home","context":{"device":'
        b'{"model":"iPhone15,2","type":"ios"},"os":{"name":"iOS","version":"17.1"},'
        b'"app":{"build":"42","name":"Shop","version":"3.1.0"}}}'
    )
    assert orjson.loads(body)["context"] == context


def test_screen_with_properties() -> None:
    body = body_of(
        {"type": "screen", "userId": "u1", "messageId": "m", "name": "Cart", "properties": {"n": 2}}
    )
    assert body.endswith(b',"name":"Cart","properties":{"n":2}}')


def test_identify_exact_bytes() -> None:
    body = body_of(
        {
            "type": "identify",
            "userId": "u1",
            "messageId": "m-identify",
            "traits": {"name": "Zoë Ångström", "email": "zoe@example.com", "age": 30, "score": 4.5},
        }
    )
    assert (
        body
        == (
            '{"version":1,"type":"identify","userId":"u1","messageId":"m-identify",'
            '"timestamp":"2026-11-21T07:04:30.123Z","traits":{"name":"Zoë Ångström",'
            '"email":"zoe@example.com","age":30,"score":4.5}}'
        ).encode()
    )


def test_identify_without_traits_has_an_empty_object() -> None:
    body = body_of({"type": "identify", "userId": "u1", "messageId": "m"})
    assert body.endswith(b',"traits":{}}')


def test_group_exact_bytes_with_a_trait_key_containing_a_space() -> None:
    body = body_of(
        {
            "type": "group",
            "userId": "u1",
            "messageId": "m-group",
            "groupId": "g-42",
            "traits": {"name": "Acme Inc", "industry": "Tech", "employee count": 250},
        }
    )
    assert body == (
        b'{"version":1,"type":"group","userId":"u1","messageId":"m-group",'
        b'"timestamp":"2026-11-21T07:04:30.123Z","groupId":"g-42","traits":{"name":"Acme Inc",'
        b'"industry":"Tech","employee count":250}}'
    )
    assert orjson.loads(body)["traits"]["employee count"] == 250


def test_alias_exact_bytes() -> None:
    body = body_of(
        {"type": "alias", "userId": "new-id", "previousId": "old-id", "messageId": "m-a"}
    )
    assert body == (
        b'{"version":1,"type":"alias","userId":"new-id","messageId":"m-a",'
        b'"timestamp":"2026-11-21T07:04:30.123Z","Previous ID":"old-id","User ID":"new-id"}'
    )
    parsed = orjson.loads(body)
    assert parsed["Previous ID"] == "old-id"
    assert parsed["User ID"] == "new-id"
    assert "previousId" not in parsed


def test_delete_exact_bytes() -> None:
    body = body_of(
        {
            "type": "delete",
            "userId": "u1",
            "anonymousId": "a1",
            "messageId": "m-delete",
            "context": {"ip": "1.2.3.4"},
            "integrations": {"All": False},
            "properties": {"x": 1},
            "traits": {"y": 2},
        }
    )
    assert body == b'{"type":"delete","userId":"u1","timestamp":"2026-11-21T07:04:30.123Z"}'
    assert keys(body) == ["type", "userId", "timestamp"]


# ---- rules across types ----------------------------------------------------------------------------

ONE_OF_EACH: list[dict[str, Any]] = [
    {"type": "page", "userId": "u1", "properties": {"path": "/"}},
    {"type": "screen", "userId": "u1", "name": "Home"},
    {"type": "identify", "userId": "u1", "traits": {"a": 1}},
    {"type": "track", "userId": "u1", "event": "E", "properties": {"a": "b"}},
    {"type": "alias", "userId": "u1", "previousId": "u0"},
    {"type": "group", "userId": "u1", "groupId": "g1", "traits": {"a": 1}},
    {"type": "delete", "userId": "u1"},
]

EXPECTED_KEYS = {
    "page": ["version", "type", "userId", "messageId", "timestamp", "properties"],
    "screen": ["version", "type", "userId", "messageId", "timestamp", "name"],
    "identify": ["version", "type", "userId", "messageId", "timestamp", "traits"],
    "track": ["version", "type", "userId", "messageId", "timestamp", "event", "properties"],
    "alias": ["version", "type", "userId", "messageId", "timestamp", "Previous ID", "User ID"],
    "group": ["version", "type", "userId", "messageId", "timestamp", "groupId", "traits"],
    "delete": ["type", "userId", "timestamp"],
}


def test_every_seed_type_is_covered() -> None:
    assert {r["type"] for r in ONE_OF_EACH} == set(CallType) == set(EXPECTED_KEYS)


@pytest.mark.parametrize("raw", ONE_OF_EACH, ids=lambda r: r["type"])
def test_keys_per_type(raw: dict[str, Any]) -> None:
    body = body_of({**raw, "messageId": "m-1"})
    assert keys(body) == EXPECTED_KEYS[raw["type"]]


@pytest.mark.parametrize("raw", ONE_OF_EACH, ids=lambda r: r["type"])
def test_version_is_1_except_delete(raw: dict[str, Any]) -> None:
    parsed = orjson.loads(body_of(raw))
    assert parsed["type"] == raw["type"]
    if raw["type"] == "delete":
        assert "version" not in parsed
        assert "messageId" not in parsed
    else:
        assert parsed["version"] == 1 == WEBHOOK_VERSION
        assert type(parsed["version"]) is int
        assert parsed["messageId"]


@pytest.mark.parametrize("raw", ONE_OF_EACH, ids=lambda r: r["type"])
def test_timestamp_has_milliseconds_and_z(raw: dict[str, Any]) -> None:
    parsed = orjson.loads(render_body(call({**raw, "timestamp": "2026-11-20T23:04:30-0800"})))
    assert parsed["timestamp"] == "2026-11-21T07:04:30.000Z"
    assert parsed["userId"] == "u1"


def test_missing_timestamp_renders_the_received_time() -> None:
    parsed = orjson.loads(render_body(call({"type": "identify", "userId": "u1"})))
    assert parsed["timestamp"] == "2026-11-21T07:04:30.579Z"


@pytest.mark.parametrize("raw", ONE_OF_EACH[:-1], ids=lambda r: r["type"])
def test_anonymous_id_and_context_only_where_present(raw: dict[str, Any]) -> None:
    plain = orjson.loads(body_of(raw))
    assert "anonymousId" not in plain
    assert "context" not in plain
    full = orjson.loads(body_of({**raw, "anonymousId": "a-9", "context": {"ip": "1.2.3.4"}}))
    assert full["anonymousId"] == "a-9"
    assert full["context"] == {"ip": "1.2.3.4"}
    assert list(full)[3] == "anonymousId"
    assert list(full)[-1] == "context"


def test_anonymous_only_call_has_null_user_id() -> None:
    parsed = orjson.loads(body_of({"type": "track", "anonymousId": "a1", "event": "E"}))
    assert parsed["userId"] is None
    assert parsed["anonymousId"] == "a1"


def test_message_id_is_the_calls() -> None:
    c = call({"type": "track", "userId": "u1", "event": "E"})
    assert orjson.loads(render_body(c))["messageId"] == c.message_id


def test_non_ascii_is_utf8_not_escaped() -> None:
    body = body_of(
        {
            "type": "track",
            "userId": "用户-1",
            "event": "Bestellung abgeschlossen ✓",
            "properties": {"städt": "Zürich", "emoji": "🎉", "quote": 'say "hi"\n'},
        }
    )
    assert "用户-1".encode() in body
    assert "Zürich".encode() in body
    assert "🎉".encode() in body
    assert b"\\u" not in body
    assert b'"quote":"say \\"hi\\"\\n"' in body
    body.decode("utf-8")  # valid UTF-8


def test_body_is_compact() -> None:
    body = body_of(
        {
            "type": "track",
            "userId": "u1",
            "event": "E",
            "properties": {"a": [1, 2, {"b": None}], "c": {"d": True}},
            "context": {"library": {"name": "x"}},
        }
    )
    assert b": " not in body and b", " not in body and b"\n" not in body
    assert orjson.dumps(orjson.loads(body)) == body


def test_same_call_renders_the_same_bytes() -> None:
    c = call({"type": "group", "userId": "u1", "groupId": "g", "traits": {"x": 1, "y": "z"}})
    assert render_body(c) == render_body(c)


def test_render_a_call_built_directly() -> None:
    c = Call(
        type=CallType.IDENTIFY,
        message_id="m",
        source_id="s",
        timestamp=0,
        received_at=0,
        user_id="u",
        traits='{"a":1}',
    )
    assert render_body(c) == (
        b'{"version":1,"type":"identify","userId":"u","messageId":"m",'
        b'"timestamp":"1970-01-01T00:00:00.000Z","traits":{"a":1}}'
    )


# ---- any valid call renders valid compact JSON -----------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=10)
json_objects = st.dictionaries(st.text(max_size=8), json_scalars, max_size=4)
ids = st.text(min_size=1, max_size=12)


@st.composite
def raw_calls(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(list(CallType)))
    raw: dict[str, Any] = {"type": kind.value, "userId": draw(ids)}
    if draw(st.booleans()):
        raw["anonymousId"] = draw(ids)
    if draw(st.booleans()):
        raw["context"] = draw(json_objects)
    if kind is CallType.TRACK:
        raw["event"] = draw(ids)
    if kind is CallType.GROUP:
        raw["groupId"] = draw(ids)
    if kind is CallType.ALIAS:
        raw["previousId"] = draw(ids)
    for name in ("properties", "traits"):
        if draw(st.booleans()):
            raw[name] = draw(json_objects)
    if kind in (CallType.PAGE, CallType.SCREEN) and draw(st.booleans()):
        raw["name"] = draw(st.text(max_size=10))
    return raw


@settings(max_examples=150, deadline=None)
@given(raw_calls())
def test_any_call_renders_valid_compact_json(raw: dict[str, Any]) -> None:
    c = call(raw)
    body = render_body(c)
    parsed = orjson.loads(body)
    assert orjson.dumps(parsed) == body
    assert parsed["type"] == raw["type"]
    assert parsed["userId"] == raw["userId"]
    if c.type is CallType.DELETE:
        assert list(parsed) == ["type", "userId", "timestamp"]
        return
    assert parsed["version"] == 1
    assert parsed["messageId"] == c.message_id
    assert ("anonymousId" in parsed) == ("anonymousId" in raw)
    assert parsed.get("context") == raw.get("context")
    if c.type is CallType.TRACK:
        assert parsed["event"] == raw["event"]
        assert parsed["properties"] == raw.get("properties", {})
    if c.type in (CallType.IDENTIFY, CallType.GROUP):
        assert parsed["traits"] == raw.get("traits", {})
    if c.type is CallType.ALIAS:
        assert (parsed["Previous ID"], parsed["User ID"]) == (raw["previousId"], raw["userId"])
