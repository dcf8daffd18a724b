"""Unit tests for pipeline.core.segment_request: a tracking API request, parsed without a server."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from pipeline.core.calls import Call, CallType
from pipeline.core.exceptions import InvalidCall
from pipeline.core.segment_request import (
    ACCEPTED_TYPES,
    BATCH_ENDPOINTS,
    HTTP_STATUS,
    SINGLE_ENDPOINTS,
    ErrorCode,
    RequestRefused,
    basic_username,
    body_write_key,
    check_type,
    correct_timestamp,
    error_envelope,
    iter_request,
    parse_json,
    skew_corrected,
)
from pipeline.core.timestamps import format_timestamp, parse_timestamp

RECEIVED = parse_timestamp("2026-11-21T07:00:00.000Z")
ORIGINAL = "2020-01-01T00:00:00.000Z"


def calls(kind: str, payload: Any, **kwargs: Any) -> list[Call]:
    return list(iter_request(kind, payload, source_id="web", received_at=RECEIVED, **kwargs))


def refused(kind: str, payload: Any, **kwargs: Any) -> RequestRefused:
    with pytest.raises(RequestRefused) as info:
        calls(kind, payload, **kwargs)
    return info.value


# ---- the skew rule -------------------------------------------------------------------------------


def test_skew_is_corrected_by_the_time_between_the_call_and_its_sending() -> None:
    item = {"originalTimestamp": ORIGINAL, "sentAt": "2020-01-01T00:01:30.250Z"}
    assert skew_corrected(item, RECEIVED) == format_timestamp(RECEIVED - 90_250)


def test_without_sent_at_the_original_timestamp_is_kept() -> None:
    assert skew_corrected({"originalTimestamp": ORIGINAL}, RECEIVED) == ORIGINAL
    assert skew_corrected({"originalTimestamp": ORIGINAL, "sentAt": ""}, RECEIVED) == ORIGINAL


def test_a_corrected_timestamp_is_never_later_than_received_at() -> None:
    # sentAt before originalTimestamp (a clock that jumped back): still no future timestamp.
    item = {"originalTimestamp": ORIGINAL, "sentAt": "2019-12-31T23:59:00.000Z"}
    assert skew_corrected(item, RECEIVED) == format_timestamp(RECEIVED)
    future = {"originalTimestamp": "2030-01-01T00:00:00.000Z"}
    assert skew_corrected(future, RECEIVED) == format_timestamp(RECEIVED)


def test_a_bad_original_timestamp_is_named_and_a_bad_sent_at_left_to_parse_call() -> None:
    with pytest.raises(InvalidCall) as info:
        skew_corrected({"originalTimestamp": "soon"}, RECEIVED)
    assert str(info.value) == "originalTimestamp: 'soon' is not an ISO 8601 date-time"
    assert skew_corrected({"originalTimestamp": ORIGINAL, "sentAt": "later"}, RECEIVED) is None
    assert skew_corrected({"originalTimestamp": 7}, RECEIVED) is None


def test_correct_timestamp_only_fills_a_missing_timestamp() -> None:
    given = {"timestamp": "2021-05-05T05:05:05.000Z", "originalTimestamp": ORIGINAL}
    assert correct_timestamp(dict(given), RECEIVED) == given
    empty = correct_timestamp({"timestamp": "", "originalTimestamp": ORIGINAL}, RECEIVED)
    assert empty["timestamp"] == ORIGINAL
    item = {"originalTimestamp": ORIGINAL}
    assert correct_timestamp(item, RECEIVED) is item and item["timestamp"] == ORIGINAL
    assert correct_timestamp({"event": "E"}, RECEIVED) == {"event": "E"}


def test_single_and_batch_calls_get_the_corrected_timestamp() -> None:
    body = {"userId": "u", "event": "E", "originalTimestamp": ORIGINAL}
    [single] = calls("track", {**body, "sentAt": "2020-01-01T00:00:10.000Z"})
    assert single.timestamp == RECEIVED - 10_000 and single.received_at == RECEIVED
    # In a batch, the batch's sentAt is the one that counts.
    batch = {"sentAt": "2020-01-01T00:00:20.000Z", "batch": [{"type": "track", **body}]}
    [item] = calls("batch", batch)
    assert item.timestamp == RECEIVED - 20_000
    assert item.sent_at == parse_timestamp("2020-01-01T00:00:20.000Z")


# ---- batches -------------------------------------------------------------------------------------


def test_batch_context_and_integrations_merge_under_the_items_own() -> None:
    batch = {
        "context": {"ip": "10.0.0.9", "locale": "de-DE"},
        "integrations": {"All": False, "Webhooks": True},
        "sentAt": "2026-11-21T06:59:00.000Z",
        "batch": [
            {"type": "track", "userId": "u", "event": "E", "context": {"locale": "fr-FR"}},
            {
                "type": "identify",
                "userId": "u",
                "integrations": {"Webhooks": False},
                "sentAt": "2026-11-21T06:58:00.000Z",
            },
        ],
    }
    first, second = calls("import", batch)
    assert orjson.loads(first.context or "") == {"ip": "10.0.0.9", "locale": "fr-FR"}
    assert orjson.loads(first.integrations or "") == {"All": False, "Webhooks": True}
    assert first.sent_at == parse_timestamp("2026-11-21T06:59:00.000Z")
    assert orjson.loads(second.context or "") == {"ip": "10.0.0.9", "locale": "de-DE"}
    assert orjson.loads(second.integrations or "") == {"All": False, "Webhooks": False}
    assert second.sent_at == parse_timestamp("2026-11-21T06:58:00.000Z")  # its own wins
    assert batch["batch"][0]["context"] == {"locale": "fr-FR"}  # the payload is not changed


def test_an_item_context_of_the_wrong_type_is_named_with_its_index() -> None:
    item = {"type": "track", "userId": "u", "event": "E", "context": [1]}
    batch = {"context": {"ip": "1"}, "batch": [item]}
    refusal = refused("batch", batch)
    assert (refusal.code, refusal.field) == (ErrorCode.INVALID_CALL, "batch[0].context")
    assert refusal.message == "batch[0].context: must be a JSON object, got an array"
    assert refusal.calls == 1


def test_batch_shape_errors() -> None:
    assert refused("batch", {}).message == "batch: is required: an array of calls"
    assert refused("b", {"batch": {}}).message == "batch: must be an array, got an object"
    top = refused("batch", {"batch": [], "integrations": "all"})
    assert (top.message, top.field) == (
        "integrations: must be a JSON object, got a string",
        "integrations",
    )
    item = refused("batch", {"batch": [{"type": "track", "userId": "u", "event": "E"}, 3]})
    assert (item.message, item.field, item.calls) == (
        "batch[1]: must be a JSON object, got a number",
        "batch[1]",
        2,
    )
    assert calls("batch", {"batch": []}) == []


def test_oversized_calls_are_too_large_and_measured_before_the_merge() -> None:
    big = {"type": "track", "userId": "u", "event": "E", "properties": {"p": "x" * 1000}}
    refusal = refused("batch", {"batch": [big]}, max_call_bytes=500)
    assert (refusal.code, refusal.field, refusal.status) == (ErrorCode.TOO_LARGE, "batch[0]", 413)
    # A large batch context does not count against each item.
    small = {"type": "track", "userId": "u", "event": "E"}
    [call] = calls("batch", {"context": {"c": "y" * 1000}, "batch": [small]}, max_call_bytes=500)
    assert orjson.loads(call.context or "") == {"c": "y" * 1000}
    single = refused("track", {"userId": "u", "event": "E", "p": "x" * 600}, max_call_bytes=500)
    assert (single.code, single.field) == (ErrorCode.TOO_LARGE, "call")


# ---- types and endpoints -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "type: is required in a batch: one of identify, track, page, screen, group, alias"),
        (
            3,
            "type: must be a string, one of identify, track, page, screen, group, alias; "
            "got a number",
        ),
        (
            "fly",
            "type: 'fly' is not a call type; use one of identify, track, page, screen, "
            "group, alias",
        ),
        (
            "delete",
            "type: 'delete' is not accepted by the tracking API: deletions come from "
            "deletion requests (pipeline delete-user)",
        ),
    ],
)
def test_check_type_refuses(value: object, message: str) -> None:
    with pytest.raises(InvalidCall) as info:
        check_type(value, "type")
    assert str(info.value) == message


def test_every_accepted_type_passes_and_delete_is_not_one() -> None:
    for call_type in ACCEPTED_TYPES:
        check_type(call_type.value, "type")
    assert CallType.DELETE not in ACCEPTED_TYPES
    assert set(SINGLE_ENDPOINTS.values()) == set(ACCEPTED_TYPES)
    assert not BATCH_ENDPOINTS & set(SINGLE_ENDPOINTS)


def test_the_path_decides_the_type_of_a_single_call() -> None:
    [call] = calls("t", {"type": "identify", "userId": "u", "event": "E", "writeKey": "wk"})
    assert call.type is CallType.TRACK and call.source_id == "web"
    [page] = calls("page", {"anonymousId": "a", "name": "Home"})
    assert page.type is CallType.PAGE and page.timestamp == RECEIVED


def test_a_body_that_is_not_an_object_is_refused() -> None:
    refusal = refused("track", [1, 2])
    assert refusal.envelope() == {
        "success": False,
        "code": "invalid_call",
        "message": "body: must be a JSON object, got an array",
        "field": "body",
    }


# ---- body and write key --------------------------------------------------------------------------


def test_parse_json() -> None:
    assert parse_json(b'{"a": 1}') == {"a": 1}
    empty = pytest.raises(RequestRefused, parse_json, b"  \n").value
    assert (empty.code, empty.field, empty.status) == (ErrorCode.EMPTY_BODY, "body", 400)
    broken = pytest.raises(RequestRefused, parse_json, b'{"a": ').value
    assert broken.code is ErrorCode.INVALID_JSON
    assert broken.message.startswith("body: not valid JSON: ")


def _basic(credentials: bytes) -> str:
    return "Basic " + base64.b64encode(credentials).decode()


def test_basic_username() -> None:
    assert basic_username(_basic(b"wk_1:")) == "wk_1"
    assert basic_username(_basic(b"wk_1:ignored")) == "wk_1"
    assert basic_username(_basic(b"wk_1")) == "wk_1"
    assert basic_username("  basic " + base64.b64encode(b"wk_2:").decode()) == "wk_2"
    assert basic_username(_basic(b":")) == ""
    assert basic_username("Bearer abc") is None
    assert basic_username("Basic not base64!") is None
    assert basic_username(_basic(b"\xff\xfe:")) is None


def test_body_write_key() -> None:
    assert body_write_key({"writeKey": "wk"}) == "wk"
    for payload in ({}, {"writeKey": ""}, {"writeKey": None}, [1]):
        missing = pytest.raises(RequestRefused, body_write_key, payload).value
        assert (missing.code, missing.field, missing.status) == (
            ErrorCode.MISSING_WRITE_KEY,
            "writeKey",
            401,
        )
    wrong = pytest.raises(RequestRefused, body_write_key, {"writeKey": 7}).value
    assert (wrong.code, wrong.message) == (
        ErrorCode.INVALID_CALL,
        "writeKey: must be a string, got a number",
    )


# ---- codes and the envelope ----------------------------------------------------------------------


def test_every_code_has_a_status_and_503_means_retry() -> None:
    assert set(HTTP_STATUS) == set(ErrorCode)
    assert {c for c, status in HTTP_STATUS.items() if status == 503} == {
        ErrorCode.KAFKA_UNAVAILABLE,
        ErrorCode.SCHEMA_REGISTRY_UNAVAILABLE,
        ErrorCode.NOT_READY,
    }


def test_the_envelope_names_the_field_only_when_there_is_one() -> None:
    assert error_envelope("not_found", "no such endpoint") == {
        "success": False,
        "code": "not_found",
        "message": "no such endpoint",
    }
    assert orjson.loads(orjson.dumps(error_envelope(ErrorCode.TOO_LARGE, "m", "body"))) == {
        "success": False,
        "code": "too_large",
        "message": "m",
        "field": "body",
    }
