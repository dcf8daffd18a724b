"""``pipeline ingest``: the HTTP ingestion API, compatible with Segment's HTTP tracking API.

    POST /v1/identify|track|page|screen|group|alias     one call (the path gives its type)
    POST /v1/batch, /v1/import                          {"batch": [...], "context": ..., ...}
    POST /v1/i|t|p|s|g|a|b                              the short paths analytics.js uses
    GET  /health   /ready   /metrics

Why it is shaped like this:

- The answer is the contract. ``200 {"success": true}`` is sent only after Kafka acknowledged every
  call of the request (``acks=all``, idempotent producer): an acknowledged call is never lost. If
  Kafka does not answer within ``ack_timeout`` the request gets 503, and the sender retries.
- Validation is all or nothing: every call of a request is parsed (``parse_call``, the same rules the
  client library applies) before the first one is produced, so an invalid request writes nothing.
- The body is read as a stream with a cap. A gzip body is inflated piece by piece with an output
  limit, so a gzip bomb costs at most the limit of memory before it is refused with 413.
- Producing never blocks the event loop: ``AsyncProducer`` hands delivery reports over from its
  poll thread.
- A producer that Kafka fenced (an idempotent producer whose messages timed out can be fenced when
  it bumps its epoch) never recovers by itself; it is replaced by a fresh one, so the API accepts
  calls again as soon as the broker is back.

Order of checks: an ``Authorization`` header is checked first (401 before the body is read), then
the body (413, 415, 400), then a ``writeKey`` in the body (401), then each call (400, 413).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import enum
import hmac
import logging
import os
import time
import zlib
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from confluent_kafka import KafkaException
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pipeline.core.calls import (
    MAX_BATCH_BYTES,
    MAX_CALL_BYTES,
    Call,
    CallType,
    json_kind,
    parse_call,
)
from pipeline.core.durations import parse_duration
from pipeline.core.exceptions import BrokerUnavailable, CallTooLarge, InvalidCall
from pipeline.core.records import call_to_record
from pipeline.core.settings import Settings
from pipeline.core.timestamps import format_timestamp, now_ms, parse_timestamp
from pipeline.kafka.clients import make_producer, topics_for, wait_for_broker
from pipeline.kafka.codec import RecordCodec
from pipeline.kafka.config_store import ConfigFollower
from pipeline.kafka.producer import AsyncProducer, Outgoing
from pipeline.kafka.registry_codec import SchemaRegistryUnavailable, make_codec
from pipeline.runtime import metrics
from pipeline.runtime.gc_tuning import tune_for_throughput

__all__ = [
    "IngestOptions",
    "ErrorCode",
    "make_ingest_app",
    "iter_request",
    "start_ingest",
    "run_ingest",
    "SINGLE_ENDPOINTS",
    "BATCH_ENDPOINTS",
    "SERVER_ARGS",
]

log = logging.getLogger("pipeline.ingest")

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
_GZIP = frozenset({"gzip", "x-gzip"})
_IDENTITY = frozenset({"", "identity"})
_CHUNK = 64 * 1024
#: Calls parsed between two yields to the event loop.
_SLICE = 256


@dataclass(frozen=True, slots=True)
class IngestOptions:
    """Limits and timeouts of the ingestion API, with their defaults.

    >>> IngestOptions(ack_timeout=2.0).max_request_bytes
    512000
    """

    #: How long a request waits for Kafka's acknowledgement before it is answered 503
    #: (env ``PIPELINE_INGEST_ACK_TIMEOUT``).
    ack_timeout: float = 10.0
    #: Seed §8: 32 KB per call.
    max_call_bytes: int = MAX_CALL_BYTES
    #: Seed §8: 500 KB per request, counted after decompression.
    max_request_bytes: int = MAX_BATCH_BYTES
    #: How long ``/ready`` waits for the broker to answer a metadata request.
    ready_timeout: float = 2.0
    #: ``Retry-After`` (seconds) sent with a 503.
    retry_after: int = 1
    #: Bearer token of the admin endpoints (``/admin/...``); ``None`` turns them off
    #: (env ``PIPELINE_ADMIN_TOKEN``).
    admin_token: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> IngestOptions:
        env = os.environ if environ is None else environ
        text = env.get("PIPELINE_INGEST_ACK_TIMEOUT")
        token = env.get("PIPELINE_ADMIN_TOKEN") or None
        if not text:
            return cls(admin_token=token)
        return cls(
            ack_timeout=parse_duration(text, name="PIPELINE_INGEST_ACK_TIMEOUT"), admin_token=token
        )


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


_STATUS = {
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


class _Refused(Exception):
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
    def from_invalid(cls, exc: InvalidCall, prefix: str = "", *, calls: int = 1) -> _Refused:
        field = f"{prefix}.{exc.field}" if prefix and exc.field != "call" else prefix or exc.field
        code = ErrorCode.TOO_LARGE if isinstance(exc, CallTooLarge) else ErrorCode.INVALID_CALL
        return cls(code, f"{field}: {exc.message}", field=field, calls=calls)

    def response(self, retry_after: int) -> web.Response:
        body: dict[str, Any] = {"success": False, "code": self.code.value, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        status = _STATUS[self.code]
        headers = {"Retry-After": str(retry_after)} if status == 503 else None
        return _json(body, status, headers)


def _json(
    body: object, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


_SUCCESS = orjson.dumps({"success": True})
#: A call that is only encoded, never sent (to register the schema at start).
_SAMPLE = Call(type=CallType.TRACK, message_id="-", source_id="-", timestamp=0, received_at=0)


# ---- pure parts: body, write key, calls -----------------------------------------------------------


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


def _skew_corrected(item: Mapping[str, Any], received_at: int) -> str | None:
    """Segment's clock-skew rule for a call without ``timestamp`` but with ``originalTimestamp``.

    ``timestamp = receivedAt - (sentAt - originalTimestamp)``: the device's clock may be wrong,
    but the time between the call and its sending is right. Never later than ``receivedAt``.
    """
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


def _prepared(item: dict[str, Any], received_at: int) -> dict[str, Any]:
    """The call with Segment's ``originalTimestamp`` turned into ``timestamp`` where needed
    (in place: the callers pass their own copy of the call)."""
    if item.get("timestamp") in (None, "") and item.get("originalTimestamp") is not None:
        corrected = _skew_corrected(item, received_at)
        if corrected is not None:
            item["timestamp"] = corrected
    return item


def _check_type(value: object, field: str) -> None:
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
    raise _Refused(
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
    """Every call of one request, validated, one at a time (the server yields to its loop in
    between); raises ``_Refused`` naming the first bad field."""
    if not isinstance(payload, dict):
        raise _Refused(
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
        call = _parse_one(_prepared(raw, received_at), source_id, received_at, size)
    except InvalidCall as exc:
        raise _Refused.from_invalid(exc) from None
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
        raise _Refused(
            ErrorCode.INVALID_CALL, "batch: is required: an array of calls", field="batch"
        )
    if not isinstance(batch, list):
        raise _Refused(
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
            _check_type(item.get("type"), "type")
            size = _size(item, max_call_bytes)
            raw = dict(item)
            if context is not None:
                raw["context"] = _merged(context, item.get("context"))
            if integrations is not None:
                raw["integrations"] = _merged(integrations, item.get("integrations"))
            if sent_at is not None and item.get("sentAt") is None:
                raw["sentAt"] = sent_at
            call = _parse_one(_prepared(raw, received_at), source_id, received_at, size)
        except InvalidCall as exc:
            raise _Refused.from_invalid(exc, where, calls=len(batch)) from None
        yield call


async def read_body(
    request: web.BaseRequest, limit: int = MAX_BATCH_BYTES, *, chunk: int = _CHUNK
) -> bytes:
    """The request body, inflated if gzip, refused with 413 as soon as it passes ``limit`` bytes.

    A gzip body is inflated chunk by chunk with ``max_length``, so a bomb never takes more than
    ``limit`` bytes of memory. The compressed body itself may not exceed ``limit`` either: JSON
    always compresses, so a compressed body that large inflates past the limit anyway.
    """
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    gzipped = encoding in _GZIP
    if not gzipped and encoding not in _IDENTITY:
        raise _Refused(
            ErrorCode.UNSUPPORTED_ENCODING,
            f"Content-Encoding: {encoding!r} is not supported; send gzip or no encoding",
            field="Content-Encoding",
        )
    too_large = _Refused(
        ErrorCode.TOO_LARGE,
        f"body: is over the limit of {limit:,} bytes a request"
        + (" (counted after decompression)" if gzipped else ""),
        field="body",
    )
    declared = request.content_length
    if declared is not None and declared > limit:
        raise too_large
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None
    out = bytearray()
    wire = 0
    try:
        while True:
            data = await request.content.read(chunk)
            if not data:
                break
            wire += len(data)
            if wire > limit:
                raise too_large
            if inflater is None:
                out += data
                continue
            out += inflater.decompress(data, limit + 1 - len(out))
            if len(out) > limit or inflater.unconsumed_tail:
                raise too_large
    except zlib.error as exc:
        raise _Refused(
            ErrorCode.INVALID_GZIP, f"body: not a valid gzip stream: {exc}", field="body"
        ) from None
    if inflater is not None and wire and not inflater.eof:
        raise _Refused(ErrorCode.INVALID_GZIP, "body: the gzip stream is truncated", field="body")
    if inflater is not None and inflater.unused_data:
        raise _Refused(
            ErrorCode.INVALID_GZIP,
            "body: data after the end of the gzip stream (one gzip member only)",
            field="body",
        )
    return bytes(out)


def parse_json(body: bytes) -> Any:
    if not body.strip():
        raise _Refused(ErrorCode.EMPTY_BODY, "body: is empty; send a JSON object", field="body")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise _Refused(
            ErrorCode.INVALID_JSON, f"body: not valid JSON: {exc}", field="body"
        ) from None


# ---- the service ---------------------------------------------------------------------------------


class _IngestService:
    """State of one ingestion process: config follower, producer, codec, limits."""

    def __init__(self, settings: Settings, options: IngestOptions) -> None:
        self.settings = settings
        self.options = options
        self.topic = topics_for(settings).calls
        self.codec: RecordCodec = make_codec(settings)
        self.follower: ConfigFollower | None = None
        self.producer: AsyncProducer | None = None
        self._closing_producers: set[asyncio.Task[int]] = set()
        self._starter: asyncio.Task[None] | None = None
        self._ingested = {t: metrics.CALLS_INGESTED.labels(t.value) for t in CallType}
        self._rejected = {c: metrics.CALLS_REJECTED.labels(c.value) for c in ErrorCode}

    def _new_producer(self) -> AsyncProducer:
        # Records left unacknowledged after ack_timeout are given up by librdkafka too: the
        # sender was told 503 and retries, so keeping them would only add duplicates.
        timeout_ms = max(1000, int(self.options.ack_timeout * 1000))
        return AsyncProducer(
            self.settings,
            producer=make_producer(self.settings, **{"message.timeout.ms": timeout_ms}),
        )

    async def start(self) -> None:
        self.producer = self._new_producer()
        self._starter = asyncio.create_task(self._start_follower())

    async def _start_follower(self) -> None:
        # The follower needs the broker once to find its partitions; wait for it without end,
        # while /health answers and /ready and /v1/* say 503.
        while True:
            try:
                await asyncio.to_thread(wait_for_broker, self.settings, 10.0)
                break
            except BrokerUnavailable as exc:
                log.warning("waiting for Kafka: %s", exc)
        self.follower = ConfigFollower(self.settings, codec=self.codec).start()
        if self.settings.schema_registry_url:
            # Register (or look up) the Call schema now, not inside the first request.
            try:
                await asyncio.to_thread(self.codec.encode, "Call", call_to_record(_SAMPLE))
            except SchemaRegistryUnavailable as exc:
                log.warning("the Schema Registry did not answer yet: %s", exc)

    async def close(self) -> None:
        if self._starter is not None:
            self._starter.cancel()
            await asyncio.gather(self._starter, return_exceptions=True)
        if self.producer is not None:
            await asyncio.to_thread(self.producer.close, self.options.ack_timeout)
        await asyncio.gather(*self._closing_producers, return_exceptions=True)
        if self.follower is not None:
            await asyncio.to_thread(self.follower.stop)

    def config_ready(self) -> bool:
        if self.follower is None:
            return False
        try:
            self.follower.wait_ready(0)
        except BrokerUnavailable:
            return False
        return True

    def _replace_producer(self, broken: AsyncProducer) -> None:
        if self.producer is not broken:
            return  # another request replaced it already
        log.warning("the Kafka producer was fenced or failed fatally; replacing it")
        self.producer = self._new_producer()
        task = asyncio.create_task(asyncio.to_thread(broken.close, self.options.ack_timeout))
        self._closing_producers.add(task)
        task.add_done_callback(self._closing_producers.discard)

    async def produce(self, calls: list[Call], records: list[Outgoing]) -> None:
        """Return once Kafka acknowledged every record; ``_Refused`` 503 otherwise."""
        producer = self.producer
        assert producer is not None
        timeout = self.options.ack_timeout
        try:
            # The backstop: librdkafka reports a timeout itself after ack_timeout.
            failed = await asyncio.wait_for(producer.send_all(records), timeout + 5.0)
        except TimeoutError:
            problem = f"no acknowledgement within {timeout:g} s"
            unanswered = len(records)
        else:
            if not failed:
                return
            if any(failure.refusal.fatal for failure in failed):
                self._replace_producer(producer)
            problem, unanswered = str(failed[0]), len(failed)
        raise _Refused(
            ErrorCode.KAFKA_UNAVAILABLE,
            f"Kafka did not acknowledge {unanswered} of {len(calls)} calls "
            f"({problem}); nothing is known to be written: retry",
            calls=len(calls),
        )

    def source_for(self, write_key: str) -> str:
        if not self.config_ready():
            raise _Refused(ErrorCode.NOT_READY, "the config is not loaded yet; retry")
        assert self.follower is not None
        source = self.follower.table.source_for_write_key(write_key)
        if source is None:
            shown = write_key if len(write_key) <= 8 else write_key[:4] + "…"
            raise _Refused(
                ErrorCode.INVALID_WRITE_KEY,
                f"writeKey: no source has the write key {shown!r}",
                field="writeKey",
            )
        return source.id

    # ---- handlers ----

    async def handle_call(self, request: web.Request) -> web.Response:
        kind = request.match_info["kind"]
        if kind not in SINGLE_ENDPOINTS and kind not in BATCH_ENDPOINTS:
            return _Refused(
                ErrorCode.NOT_FOUND,
                f"/v1/{kind}: no such endpoint; use identify, track, page, screen, group, "
                "alias, batch or import",
            ).response(self.options.retry_after)
        try:
            calls = await self._accept(request, kind)
        except _Refused as refused:
            if refused.calls:
                self._rejected[refused.code].inc(refused.calls)
            if refused.code is not ErrorCode.KAFKA_UNAVAILABLE:
                log.debug("refused %s: %s", request.path, refused.message)
            return refused.response(self.options.retry_after)
        per_type: dict[CallType, int] = {}
        for call in calls:  # one counter update per type, not per call
            per_type[call.type] = per_type.get(call.type, 0) + 1
        for call_type, count in per_type.items():
            self._ingested[call_type].inc(count)
        return web.Response(body=_SUCCESS, content_type="application/json")

    async def _accept(self, request: web.Request, kind: str) -> list[Call]:
        source_id: str | None = None
        header = request.headers.get("Authorization")
        if header:
            username = basic_username(header)
            if username is None:
                raise _Refused(
                    ErrorCode.INVALID_WRITE_KEY,
                    "Authorization: not an HTTP Basic credential; send the write key as the "
                    "username with an empty password",
                    field="Authorization",
                )
            if username:
                source_id = self.source_for(username)
        body = await read_body(request, self.options.max_request_bytes)
        payload = parse_json(body)
        received_at = now_ms()
        if source_id is None:
            source_id = self.source_for(self._body_write_key(payload))
        # Parse and encode in slices, letting other requests run in between: a 500 KB batch of
        # tiny calls is ten thousand of them.
        calls: list[Call] = []
        records: list[Outgoing] = []
        topic, encode = self.topic, self.codec.encode
        try:
            for call in iter_request(
                kind,
                payload,
                source_id=source_id,
                received_at=received_at,
                max_call_bytes=self.options.max_call_bytes,
            ):
                calls.append(call)
                records.append((topic, call.key, encode("Call", call_to_record(call))))
                if len(calls) % _SLICE == 0:
                    await asyncio.sleep(0)
        except SchemaRegistryUnavailable as exc:
            raise _Refused(
                ErrorCode.SCHEMA_REGISTRY_UNAVAILABLE,
                f"the Schema Registry did not answer ({exc}); nothing was written: retry",
            ) from None
        if calls:
            await self.produce(calls, records)
        return calls

    @staticmethod
    def _body_write_key(payload: object) -> str:
        key = payload.get("writeKey") if isinstance(payload, dict) else None
        if key is None or key == "":
            raise _Refused(
                ErrorCode.MISSING_WRITE_KEY,
                "writeKey: no write key; send it as the HTTP Basic username (empty password) "
                "or as writeKey in the body",
                field="writeKey",
            )
        if not isinstance(key, str):
            raise _Refused(
                ErrorCode.INVALID_CALL,
                f"writeKey: must be a string, got {json_kind(key)}",
                field="writeKey",
            )
        return key

    # ---- admin: deletion requests (seed §1.6) ----------------------------------------------------

    def _admin_refusal(self, request: web.Request) -> web.Response | None:
        token = self.options.admin_token
        if token is None:
            return _admin_error(
                404,
                "admin_disabled",
                "admin endpoints are off; set PIPELINE_ADMIN_TOKEN to turn them on",
            )
        given = request.headers.get("Authorization", "")
        expected = f"Bearer {token}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            return _admin_error(
                401, "unauthorized", "Authorization: Bearer <PIPELINE_ADMIN_TOKEN> is required"
            )
        return None

    async def delete_user(self, request: web.Request) -> web.Response:
        """``POST /admin/delete-user {"userId", "reason"?, "force"?}``: a deletion request."""
        from pipeline.ops.deletion import request_deletion

        refused = self._admin_refusal(request)
        if refused is not None:
            return refused
        try:
            payload = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return _admin_error(400, "invalid_json", f"body: not JSON: {exc}")
        if not isinstance(payload, dict) or not isinstance(payload.get("userId"), str):
            return _admin_error(400, "invalid_field", "userId: a string is required")
        reason, force = payload.get("reason"), payload.get("force", False)
        if reason is not None and not isinstance(reason, str):
            return _admin_error(400, "invalid_field", "reason: must be a string")
        if not isinstance(force, bool):
            return _admin_error(400, "invalid_field", "force: must be true or false")
        assert self.follower is not None
        try:
            outcome = await asyncio.to_thread(
                request_deletion,
                self.settings,
                payload["userId"],
                reason=reason,
                force=force,
                table=self.follower.table,
            )
        except InvalidCall as exc:
            return _admin_error(400, "invalid_field", str(exc))
        except BrokerUnavailable as exc:
            return _admin_error(503, "kafka_unavailable", str(exc))
        return web.json_response(
            {
                "success": not outcome.failed,
                "userId": outcome.user_id,
                "notified": outcome.notified,
                "alreadyNotified": sorted(outcome.already),
                "unaffected": outcome.unaffected,
                "failed": outcome.failed,
            },
            status=200 if not outcome.failed else 503,
        )

    async def deletion_status(self, request: web.Request) -> web.Response:
        """``GET /admin/delete-user/{user_id}``: the recorded requests and what they sent."""
        from pipeline.ops.deletion import read_request

        refused = self._admin_refusal(request)
        if refused is not None:
            return refused
        try:
            record = await asyncio.to_thread(
                read_request, self.settings, request.match_info["user_id"]
            )
        except InvalidCall as exc:
            return _admin_error(400, "invalid_field", str(exc))
        except BrokerUnavailable as exc:
            return _admin_error(503, "kafka_unavailable", str(exc))
        if record is None:
            return _admin_error(404, "not_found", "no deletion request for this user")
        return web.json_response({"success": True, **record})

    async def health(self, _request: web.Request) -> web.Response:
        return _json({"status": "ok"})

    async def ready(self, _request: web.Request) -> web.Response:
        problems: list[str] = []
        if not self.config_ready():
            problems.append("the config is not loaded yet")
        producer = self.producer
        if producer is not None:
            try:
                metadata = await asyncio.to_thread(
                    producer.raw.list_topics, timeout=self.options.ready_timeout
                )
                if self.topic not in metadata.topics:
                    problems.append(f"the topic {self.topic!r} does not exist")
            except KafkaException as exc:
                problems.append(
                    f"Kafka did not answer within {self.options.ready_timeout:g} s: {exc}"
                )
        if problems:
            return _json({"ready": False, "problems": problems}, 503)
        return _json({"ready": True})

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})


#: Server arguments the app needs. aiohttp would otherwise inflate gzip bodies itself, without a
#: limit; ``read_body`` inflates them with one.
SERVER_ARGS: Mapping[str, Any] = {"auto_decompress": False}


def _admin_error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"success": False, "code": code, "message": message}, status=status)


def make_ingest_app(settings: Settings, options: IngestOptions | None = None) -> web.Application:
    """The aiohttp application; Kafka clients start with the app and stop with it.

    Serve it with ``SERVER_ARGS`` (``web.AppRunner(app, **SERVER_ARGS)``), as ``start_ingest``
    and ``run_ingest`` do.
    """
    service = _IngestService(settings, options or IngestOptions())

    async def lifecycle(_app: web.Application) -> AsyncIterator[None]:
        await service.start()
        yield
        await service.close()

    app = web.Application()
    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/v1/{kind}", service.handle_call)
    app.router.add_post("/admin/delete-user", service.delete_user)
    app.router.add_get("/admin/delete-user/{user_id}", service.deletion_status)
    app.router.add_get("/health", service.health)
    app.router.add_get("/ready", service.ready)
    app.router.add_get("/metrics", service.metrics)
    return app


async def start_ingest(
    settings: Settings,
    host: str = "127.0.0.1",
    port: int = 8080,
    options: IngestOptions | None = None,
) -> tuple[web.AppRunner, str]:
    """Serve the API on the running loop; returns the runner (``await runner.cleanup()``)
    and the base URL. ``port=0`` picks a free port."""
    runner = web.AppRunner(
        make_ingest_app(settings, options), access_log=None, shutdown_timeout=5.0, **SERVER_ARGS
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, f"http://{host}:{bound}"


def run_ingest(
    settings: Settings,
    host: str = "127.0.0.1",
    port: int = 8080,
    options: IngestOptions | None = None,
    *,
    access_log: bool = False,
) -> None:
    """The entry point of ``pipeline ingest``: serve until SIGINT/SIGTERM, then finish requests."""
    options = options or IngestOptions.from_env()
    log.info(
        "ingestion API on http://%s:%d (Kafka %s, ack timeout %g s)",
        host,
        port,
        settings.bootstrap_servers,
        options.ack_timeout,
    )
    started = time.monotonic()
    tune_for_throughput()
    web.run_app(
        make_ingest_app(settings, options),
        host=host,
        port=port,
        print=None,
        access_log=logging.getLogger("aiohttp.access") if access_log else None,
        shutdown_timeout=options.ack_timeout + 5.0,
        **SERVER_ARGS,
    )
    log.info("ingestion API stopped after %.0f s", time.monotonic() - started)
