"""A Segment HTTP tracking API request, parsed: the body, the write key, and its calls.

Pure: no sockets, no aiohttp, no Kafka. The ingestion API (``pipeline.http.ingest``) reads the
body from the network and hands it here; ``pipeline send`` applies the same timestamp rule
(``correct_timestamp``) to each line, so a call gets the same ``timestamp`` either way.

    >>> calls = iter_request("track", {"userId": "u1", "event": "E"}, source_id="web",
    ...                      received_at=1_000_000)
    >>> [(c.type.value, c.user_id, c.timestamp) for c in calls]
    [('track', 'u1', 1000000)]

A request that breaks a rule raises ``RequestRefused``: its ``code`` (an ``ErrorCode``), its
message, and the ``field`` it names, which ``envelope()`` turns into the API's error answer
``{"success": false, "code": ..., "message": ..., "field": ...}``.

Validation is all or nothing: ``iter_request`` yields the calls one at a time (so the server can
let other requests run in between), and the server produces none of them until the last one is
parsed.
"""

from __future__ import annotations

import base64
import binascii
import enum
from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from pipeline.core.calls import MAX_CALL_BYTES, Call, CallType, json_kind, parse_call
from pipeline.core.exceptions import CallTooLarge, InvalidCall
from pipeline.core.timestamps import format_timestamp, parse_timestamp

__all__ = [
    "ErrorCode",
    "HTTP_STATUS",
    "RequestRefused",
    "error_envelope",
    "SINGLE_ENDPOINTS",
    "BATCH_ENDPOINTS",
    "ACCEPTED_TYPES",
    "basic_username",
    "body_write_key",
    "parse_json",
    "correct_timestamp",
    "skew_corrected",
    "check_type",
    "iter_request",
]

#: ``/v1/<name>`` → the call type it takes. The one-letter names are analytics.js's short paths.
SINGLE_ENDPOINTS: Mapping[str, CallType] = {
    "identify": CallType.IDENTIFY,
    "track": CallType.TRACK,
    "page": CallType.PAGE,
    "screen": CallType.SCREEN,
    "group": CallType.GROUP,
    "alias": CallType.ALIAS,
    "i": CallType.IDENTIFY,
    "t": CallType.TRACK,
    "p": CallType.PAGE,
    "s": CallType.SCREEN,
    "g": CallType.GROUP,
    "a": CallType.ALIAS,
}
BATCH_ENDPOINTS = frozenset({"batch", "import", "b"})
#: Types the tracking API takes. ``delete`` calls come only from deletion requests.
ACCEPTED_TYPES = tuple(t for t in CallType if t is not CallType.DELETE)
_ACCEPTED_TEXT = ", ".join(ACCEPTED_TYPES)


class ErrorCode(enum.StrEnum):
    """The ``code`` of an error answer; also the ``reason`` label of ``calls_rejected_total``."""

    EMPTY_BODY = "empty_body"
    """400: the body is empty."""
    INVALID_JSON = "invalid_json"
    """400: the body is not JSON."""
    INVALID_GZIP = "invalid_gzip"
    """400: ``Content-Encoding: gzip`` but the body is not a complete gzip stream."""
    INVALID_CALL = "invalid_call"
    """400: a field breaks a rule (missing, wrong type, bad value); ``field`` names it."""
    MISSING_WRITE_KEY = "missing_write_key"
    """401: no write key, neither as the Basic username nor as ``writeKey``."""
    INVALID_WRITE_KEY = "invalid_write_key"
    """401: no source has this write key."""
    NOT_FOUND = "not_found"
    """404: no such endpoint."""
    TOO_LARGE = "too_large"
    """413: a call over 32 KB or a request over 500 KB."""
    UNSUPPORTED_ENCODING = "unsupported_encoding"
    """415: a ``Content-Encoding`` other than gzip or identity."""
    KAFKA_UNAVAILABLE = "kafka_unavailable"
    """503: Kafka did not acknowledge in time; nothing is known to be written; retry."""
    SCHEMA_REGISTRY_UNAVAILABLE = "schema_registry_unavailable"
    """503: the Schema Registry (when one is configured) did not answer; nothing was written."""
    NOT_READY = "not_ready"
    """503: the config is not loaded yet; retry."""


#: The HTTP status each code is answered with (as its docstring says).
HTTP_STATUS: Mapping[ErrorCode, int] = {
    ErrorCode.EMPTY_BODY: 400,
    ErrorCode.INVALID_JSON: 400,
    ErrorCode.INVALID_GZIP: 400,
    ErrorCode.INVALID_CALL: 400,
    ErrorCode.MISSING_WRITE_KEY: 401,
    ErrorCode.INVALID_WRITE_KEY: 401,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.UNSUPPORTED_ENCODING: 415,
    ErrorCode.KAFKA_UNAVAILABLE: 503,
    ErrorCode.SCHEMA_REGISTRY_UNAVAILABLE: 503,
    ErrorCode.NOT_READY: 503,
}


def error_envelope(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    """The body of every error answer of the ingestion API, tracking and admin endpoints alike.

    >>> error_envelope("invalid_call", "event: is required for a track call", "event")
    {'success': False, 'code': 'invalid_call', 'message': 'event: is required for a track call', 'field': 'event'}
    """  # noqa: E501
    body: dict[str, Any] = {"success": False, "code": code, "message": message}
    if field is not None:
        body["field"] = field
    return body


class RequestRefused(Exception):
    """A request answered with an error; ``calls`` is how many calls it held, when known."""

    def __init__(
        self, code: ErrorCode, message: str, *, field: str | None = None, calls: int = 1
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.calls = calls

    @classmethod
    def from_invalid(cls, exc: InvalidCall, prefix: str = "", *, calls: int = 1) -> RequestRefused:
        field = f"{prefix}.{exc.field}" if prefix and exc.field != "call" else prefix or exc.field
        code = ErrorCode.TOO_LARGE if isinstance(exc, CallTooLarge) else ErrorCode.INVALID_CALL
        return cls(code, f"{field}: {exc.message}", field=field, calls=calls)

    @property
    def status(self) -> int:
        return HTTP_STATUS[self.code]

    def envelope(self) -> dict[str, Any]:
        return error_envelope(self.code.value, self.message, self.field)


# ---- the body and the write key ------------------------------------------------------------------


def parse_json(body: bytes) -> Any:
    """The request body (already inflated) as JSON; ``RequestRefused`` if empty or not JSON."""
    if not body.strip():
        raise RequestRefused(
            ErrorCode.EMPTY_BODY, "body: is empty; send a JSON object", field="body"
        )
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestRefused(
            ErrorCode.INVALID_JSON, f"body: not valid JSON: {exc}", field="body"
        ) from None


def basic_username(header: str) -> str | None:
    """The username of an HTTP Basic ``Authorization`` header; a missing colon is accepted.

    >>> basic_username("Basic " + base64.b64encode(b"wk_1:").decode())
    'wk_1'
    >>> basic_username("Basic " + base64.b64encode(b"wk_1").decode())
    'wk_1'
    """
    scheme, _, credentials = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return decoded.partition(":")[0]


def body_write_key(payload: object) -> str:
    """The ``writeKey`` of a request body (used when no Basic username gave one)."""
    key = payload.get("writeKey") if isinstance(payload, dict) else None
    if key is None or key == "":
        raise RequestRefused(
            ErrorCode.MISSING_WRITE_KEY,
            "writeKey: no write key; send it as the HTTP Basic username (empty password) "
            "or as writeKey in the body",
            field="writeKey",
        )
    if not isinstance(key, str):
        raise RequestRefused(
            ErrorCode.INVALID_CALL,
            f"writeKey: must be a string, got {json_kind(key)}",
            field="writeKey",
        )
    return key


# ---- the calls -----------------------------------------------------------------------------------


def skew_corrected(item: Mapping[str, Any], received_at: int) -> str | None:
    """Segment's clock-skew rule for a call without ``timestamp`` but with ``originalTimestamp``.

    ``timestamp = receivedAt - (sentAt - originalTimestamp)``: the device's clock may be wrong,
    but the time between the call and its sending is right. Never later than ``receivedAt``.

    >>> skew_corrected({"originalTimestamp": "2020-01-01T00:00:00.000Z",
    ...                 "sentAt": "2020-01-01T00:01:00.000Z"}, parse_timestamp("2026-11-21T07:00:00Z"))
    '2026-11-21T06:59:00.000Z'
    """  # noqa: E501
    original = item.get("originalTimestamp")
    if not isinstance(original, str):
        return None
    try:
        original_ms = parse_timestamp(original)
    except ValueError:
        raise InvalidCall(
            "originalTimestamp", f"{original!r} is not an ISO 8601 date-time"
        ) from None
    sent_at = item.get("sentAt")
    if isinstance(sent_at, str) and sent_at:
        try:
            sent_ms = parse_timestamp(sent_at)
        except ValueError:
            return None  # parse_call names the sentAt problem
        return format_timestamp(min(received_at, received_at - (sent_ms - original_ms)))
    return format_timestamp(min(received_at, original_ms))


def correct_timestamp(item: dict[str, Any], received_at: int) -> dict[str, Any]:
    """The call with Segment's ``originalTimestamp`` turned into ``timestamp`` where needed
    (in place: the callers pass their own copy of the call). Raises ``InvalidCall`` for an
    ``originalTimestamp`` that is not a date-time."""
    if item.get("timestamp") in (None, "") and item.get("originalTimestamp") is not None:
        corrected = skew_corrected(item, received_at)
        if corrected is not None:
            item["timestamp"] = corrected
    return item


def check_type(value: object, field: str) -> None:
    """A batch item's ``type``: one the tracking API takes (``InvalidCall`` otherwise)."""
    if value is None:
        raise InvalidCall(field, f"is required in a batch: one of {_ACCEPTED_TEXT}")
    if not isinstance(value, str):
        raise InvalidCall(
            field, f"must be a string, one of {_ACCEPTED_TEXT}; got {json_kind(value)}"
        )
    if value == CallType.DELETE:
        raise InvalidCall(
            field,
            "'delete' is not accepted by the tracking API: deletions come from deletion "
            "requests (pipeline delete-user)",
        )
    if value not in ACCEPTED_TYPES:
        raise InvalidCall(field, f"{value!r} is not a call type; use one of {_ACCEPTED_TEXT}")


def _merged(top: dict[str, Any] | None, own: object) -> object:
    """Top-level ``context``/``integrations`` under an item's own (the item's keys win)."""
    if not top:
        return own
    if own is None:
        return top
    if isinstance(own, dict):
        return {**top, **own}
    return own  # the wrong type: parse_call names it


def _object_or_none(payload: Mapping[str, Any], field: str) -> dict[str, Any] | None:
    value = payload.get(field)
    if value is None or isinstance(value, dict):
        return value
    raise RequestRefused(
        ErrorCode.INVALID_CALL,
        f"{field}: must be a JSON object, got {json_kind(value)}",
        field=field,
    )


def iter_request(
    kind: str,
    payload: Any,
    *,
    source_id: str,
    received_at: int,
    max_call_bytes: int = MAX_CALL_BYTES,
) -> Iterator[Call]:
    """Every call of one request to ``/v1/<kind>``, validated, one at a time (the server yields
    to its loop in between); raises ``RequestRefused`` naming the first bad field.

    ``kind`` is one of ``SINGLE_ENDPOINTS`` or ``BATCH_ENDPOINTS``.
    """
    if not isinstance(payload, dict):
        raise RequestRefused(
            ErrorCode.INVALID_CALL,
            f"body: must be a JSON object, got {json_kind(payload)}",
            field="body",
        )
    if kind in BATCH_ENDPOINTS:
        yield from _parse_batch(payload, source_id, received_at, max_call_bytes)
        return
    call_type = SINGLE_ENDPOINTS[kind]
    raw = {k: v for k, v in payload.items() if k != "writeKey"}
    try:
        size = _size(raw, max_call_bytes)
        raw["type"] = call_type.value  # the path decides; a stray "type" in the body is ignored
        call = _parse_one(correct_timestamp(raw, received_at), source_id, received_at, size)
    except InvalidCall as exc:
        raise RequestRefused.from_invalid(exc) from None
    yield call


def _size(raw: Mapping[str, Any], max_bytes: int) -> int:
    """A call's size: its compact JSON as the sender sent it (before the batch's context,
    integrations and sentAt are merged in), which is what a client can measure too."""
    size = len(orjson.dumps(raw, default=str))
    if size > max_bytes:
        raise CallTooLarge("call", size, max_bytes)
    return size


def _parse_one(raw: dict[str, Any], source_id: str, received_at: int, size: int) -> Call:
    return parse_call(raw, source_id=source_id, received_at=received_at, raw_size=size)


def _parse_batch(
    payload: dict[str, Any], source_id: str, received_at: int, max_call_bytes: int
) -> Iterator[Call]:
    batch = payload.get("batch")
    if batch is None:
        raise RequestRefused(
            ErrorCode.INVALID_CALL, "batch: is required: an array of calls", field="batch"
        )
    if not isinstance(batch, list):
        raise RequestRefused(
            ErrorCode.INVALID_CALL,
            f"batch: must be an array, got {json_kind(batch)}",
            field="batch",
        )
    context = _object_or_none(payload, "context")
    integrations = _object_or_none(payload, "integrations")
    sent_at = payload.get("sentAt")
    for index, item in enumerate(batch):
        where = f"batch[{index}]"
        try:
            if not isinstance(item, dict):
                raise InvalidCall("call", f"must be a JSON object, got {json_kind(item)}")
            check_type(item.get("type"), "type")
            size = _size(item, max_call_bytes)
            raw = dict(item)
            if context is not None:
                raw["context"] = _merged(context, item.get("context"))
            if integrations is not None:
                raw["integrations"] = _merged(integrations, item.get("integrations"))
            if sent_at is not None and item.get("sentAt") is None:
                raw["sentAt"] = sent_at
            call = _parse_one(correct_timestamp(raw, received_at), source_id, received_at, size)
        except InvalidCall as exc:
            raise RequestRefused.from_invalid(exc, where, calls=len(batch)) from None
        yield call
