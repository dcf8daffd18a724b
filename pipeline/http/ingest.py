"""``pipeline ingest``: the HTTP ingestion API, compatible with Segment's HTTP tracking API.

    POST /v1/identify|track|page|screen|group|alias     one call (the path gives its type)
    POST /v1/batch, /v1/import                          {"batch": [...], "context": ..., ...}
    POST /v1/i|t|p|s|g|a|b                              the short paths analytics.js uses
    GET  /health   /ready   /metrics
    POST /admin/delete-user, GET /admin/delete-user/{id}   deletion requests (``pipeline.http.admin``)

The request's parsing (body JSON, write key, calls, the clock-skew rule, error codes) is pure and
lives in ``pipeline.core.segment_request``; this module is the I/O around it: reading the body,
looking up the write key, producing, answering.

Why it is shaped like this:

- The answer is the contract. ``200 {"success": true}`` is sent only after Kafka acknowledged every
  call of the request (``acks=all``, idempotent producer): an acknowledged call is never lost. If
  Kafka does not answer within ``ack_timeout`` the request gets 503, and the sender retries.
- Validation is all or nothing: every call of a request is parsed (``iter_request``, with
  ``parse_call``'s rules, the client library's too) before the first one is produced, so an
  invalid request writes nothing.
- The body is read as a stream with a cap. A gzip body is inflated piece by piece with an output
  limit, so a gzip bomb costs at most the limit of memory before it is refused with 413.
- Producing never blocks the event loop: ``AsyncProducer`` serves delivery reports on it without
  waiting (``poll(0)``) while a request waits for them.
- A producer that Kafka fenced (an idempotent producer whose messages timed out can be fenced when
  it bumps its epoch) never recovers by itself; it is replaced by a fresh one, so the API accepts
  calls again as soon as the broker is back.

Order of checks: an ``Authorization`` header is checked first (401 before the body is read), then
the body (413, 415, 400), then a ``writeKey`` in the body (401), then each call (400, 413).
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web
from confluent_kafka import KafkaException
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pipeline.core.calls import MAX_BATCH_BYTES, MAX_CALL_BYTES, Call, CallType
from pipeline.core.config import ConfigTable, shown_write_key
from pipeline.core.exceptions import BrokerUnavailable
from pipeline.core.records import call_to_record
from pipeline.core.segment_request import (
    BATCH_ENDPOINTS,
    SINGLE_ENDPOINTS,
    ErrorCode,
    RequestRefused,
    basic_username,
    body_write_key,
    iter_request,
    parse_json,
)
from pipeline.core.settings import Settings
from pipeline.core.timestamps import now_ms
from pipeline.http.admin import AdminEndpoints
from pipeline.http.errors import error_response
from pipeline.kafka.clients import make_producer, topics_for
from pipeline.kafka.cluster import reach
from pipeline.kafka.codec import RecordCodec
from pipeline.kafka.config_store import ConfigFollower
from pipeline.kafka.errors import Produced
from pipeline.kafka.producer import AsyncProducer
from pipeline.kafka.registry_codec import SchemaRegistryUnavailable, make_codec
from pipeline.runtime import event_loop, metrics, tracing
from pipeline.runtime.gc_tuning import tune_for_throughput

__all__ = [
    "IngestOptions",
    "make_ingest_app",
    "read_body",
    "start_ingest",
    "run_ingest",
    "SERVER_ARGS",
]

log = logging.getLogger("pipeline.ingest")

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
    def from_settings(cls, settings: Settings) -> IngestOptions:
        """The options of ``PIPELINE_INGEST_ACK_TIMEOUT`` and ``PIPELINE_ADMIN_TOKEN``."""
        return cls(
            ack_timeout=settings.ingest_ack_timeout, admin_token=settings.secret("admin_token")
        )


def _json(
    body: object, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.Response(
        body=orjson.dumps(body), status=status, content_type="application/json", headers=headers
    )


_SUCCESS = orjson.dumps({"success": True})
#: A call that is only encoded, never sent (to register the schema at start).
_SAMPLE = Call(type=CallType.TRACK, message_id="-", source_id="-", timestamp=0, received_at=0)


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
        raise RequestRefused(
            ErrorCode.UNSUPPORTED_ENCODING,
            f"Content-Encoding: {encoding!r} is not supported; send gzip or no encoding",
            field="Content-Encoding",
        )
    too_large = RequestRefused(
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
        raise RequestRefused(
            ErrorCode.INVALID_GZIP, f"body: not a valid gzip stream: {exc}", field="body"
        ) from None
    if inflater is not None and wire and not inflater.eof:
        raise RequestRefused(
            ErrorCode.INVALID_GZIP, "body: the gzip stream is truncated", field="body"
        )
    if inflater is not None and inflater.unused_data:
        raise RequestRefused(
            ErrorCode.INVALID_GZIP,
            "body: data after the end of the gzip stream (one gzip member only)",
            field="body",
        )
    return bytes(out)


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
                await asyncio.to_thread(reach, self.settings, 10.0)
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

    async def produce(self, calls: list[Call], records: list[Produced]) -> None:
        """Return once Kafka acknowledged every record; ``RequestRefused`` 503 otherwise."""
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
        raise RequestRefused(
            ErrorCode.KAFKA_UNAVAILABLE,
            f"Kafka did not acknowledge {unanswered} of {len(calls)} calls "
            f"({problem}); nothing is known to be written: retry",
            calls=len(calls),
        )

    def source_for(self, write_key: str) -> str:
        if not self.config_ready():
            raise RequestRefused(ErrorCode.NOT_READY, "the config is not loaded yet; retry")
        assert self.follower is not None
        source = self.follower.table.source_for_write_key(write_key)
        if source is None:
            shown = shown_write_key(write_key)
            raise RequestRefused(
                ErrorCode.INVALID_WRITE_KEY,
                f"writeKey: no source has the write key {shown!r}",
                field="writeKey",
            )
        return source.id

    def table(self) -> ConfigTable | None:
        """The followed config, once loaded (for the admin endpoints)."""
        return self.follower.table if self.follower is not None else None

    # ---- handlers ----

    def _answer(self, refused: RequestRefused) -> web.Response:
        status = refused.status
        headers = {"Retry-After": str(self.options.retry_after)} if status == 503 else None
        return error_response(status, refused.code, refused.message, refused.field, headers)

    async def handle_call(self, request: web.Request) -> web.Response:
        kind = request.match_info["kind"]
        if kind not in SINGLE_ENDPOINTS and kind not in BATCH_ENDPOINTS:
            return self._answer(
                RequestRefused(
                    ErrorCode.NOT_FOUND,
                    f"/v1/{kind}: no such endpoint; use identify, track, page, screen, group, "
                    "alias, batch or import",
                )
            )
        span = None
        if tracing.enabled():  # the request's span: a child of the sender's, or a new trace
            span = tracing.start_span(
                f"POST /v1/{kind}",
                request.headers,
                tracing.SpanKind.SERVER,
                {
                    "http.request.method": "POST",
                    "url.path": request.path,
                    "http.route": request.path,
                },
            )
            trace = tracing.headers_of(span)
        else:  # passed on as the sender gave it, if it is one
            trace = _passed_on(request.headers)
        try:
            calls = await self._accept(request, kind, trace)
        except RequestRefused as refused:
            if refused.calls:
                self._rejected[refused.code].inc(refused.calls)
            if refused.code is not ErrorCode.KAFKA_UNAVAILABLE:
                log.debug("refused %s: %s", request.path, refused.message)
            if span is not None:
                _ended(span, refused.status, refused.code.value)
            return self._answer(refused)
        except BaseException:
            if span is not None:  # a bug (or the server stopping): the span still ends
                _ended(span, 500)
            raise
        per_type: dict[CallType, int] = {}
        for call in calls:  # one counter update per type, not per call
            per_type[call.type] = per_type.get(call.type, 0) + 1
        for call_type, count in per_type.items():
            self._ingested[call_type].inc(count)
        if span is not None:
            span.set_attribute("pipeline.calls", len(calls))
            _ended(span, 200)
        return web.Response(body=_SUCCESS, content_type="application/json")

    async def _accept(
        self, request: web.Request, kind: str, trace: tracing.TraceHeaders
    ) -> list[Call]:
        """The request's calls, written to Kafka; each record carries ``trace``, the request's
        trace context (empty: none)."""
        source_id: str | None = None
        header = request.headers.get("Authorization")
        if header:
            username = basic_username(header)
            if username is None:
                raise RequestRefused(
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
            source_id = self.source_for(body_write_key(payload))
        # Parse and encode in slices, letting other requests run in between: a 500 KB batch of
        # tiny calls is ten thousand of them.
        calls: list[Call] = []
        records: list[Produced] = []
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
                value = encode("Call", call_to_record(call))
                records.append(
                    (topic, call.key, value, trace) if trace else (topic, call.key, value)
                )
                if len(calls) % _SLICE == 0:
                    await asyncio.sleep(0)
        except SchemaRegistryUnavailable as exc:
            raise RequestRefused(
                ErrorCode.SCHEMA_REGISTRY_UNAVAILABLE,
                f"the Schema Registry did not answer ({exc}); nothing was written: retry",
            ) from None
        if calls:
            await self.produce(calls, records)
        return calls

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


def _passed_on(headers: Mapping[str, str]) -> tracing.TraceHeaders:
    """A request's trace context, to pass on as it is (tracing off): none if it is not valid
    (``tracing.cleaned``; aiohttp gives undecodable bytes as surrogates)."""
    if tracing.TRACEPARENT not in headers:
        return []
    return tracing.cleaned(
        [
            (name, headers[name].encode("utf-8", "surrogateescape"))
            for name in (tracing.TRACEPARENT, tracing.TRACESTATE)
            if name in headers
        ]
    )


def _ended(span: tracing.AnySpan, status: int, refused: str | None = None) -> None:
    span.set_attribute("http.response.status_code", status)
    if refused is not None:
        span.set_attribute("pipeline.refused", refused)
    if status >= 500:
        span.set_attribute("error.type", str(status))
        span.set_status(tracing.StatusCode.ERROR)
    span.end()


#: Server arguments the app needs. aiohttp would otherwise inflate gzip bodies itself, without a
#: limit; ``read_body`` inflates them with one.
SERVER_ARGS: Mapping[str, Any] = {"auto_decompress": False}


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
    AdminEndpoints(settings, service.options.admin_token, service.table).add_routes(app)
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
    options = options or IngestOptions.from_settings(settings)
    log.info(
        "ingestion API on http://%s:%d (Kafka %s, ack timeout %g s)",
        host,
        port,
        settings.bootstrap_servers,
        options.ack_timeout,
    )
    started = time.monotonic()
    tune_for_throughput()
    factory = event_loop.loop_factory(settings.event_loop)
    web.run_app(
        make_ingest_app(settings, options),
        loop=None if factory is None else factory(),
        host=host,
        port=port,
        print=None,
        access_log=logging.getLogger("aiohttp.access") if access_log else None,
        shutdown_timeout=options.ack_timeout + 5.0,
        **SERVER_ARGS,
    )
    log.info("ingestion API stopped after %.0f s", time.monotonic() - started)
