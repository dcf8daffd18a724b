"""How batches leave the process: HTTP to the ingestion API, or Kafka directly.

Every transport has one method that matters, ``send(batch)``: it returns once the whole batch is
acknowledged (HTTP 2xx; Kafka acks from every in-sync replica) or raises ``DeliveryError`` saying
whether a retry may help. Batching, retries and timing live above, in the client, and are the same
for every transport.

The Kafka transport writes the same Avro ``Call`` records as the ingestion API, so the rest of the
pipeline cannot tell the two apart. It resolves nothing: it needs the ``source_id`` the calls
belong to (the API learns it from the write key).
"""

from __future__ import annotations

import asyncio
import gzip as gzip_module
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import httpx
import orjson
from confluent_kafka import KafkaError, Producer

from pipeline.core.records import call_to_record
from pipeline.core.settings import Settings
from pipeline.core.timestamps import format_timestamp, now_ms
from pipeline.kafka.clients import producer_config, topics_for
from pipeline.kafka.errors import FATAL_PRODUCER_CODES
from pipeline.kafka.producer import AsyncProducer
from pipeline.kafka.registry_codec import make_codec

from ._backoff import parse_retry_after
from ._batches import batch_body
from ._errors import DeliveryError
from ._messages import Queued

__all__ = [
    "Transport",
    "AsyncTransport",
    "HttpTransport",
    "AsyncHttpTransport",
    "KafkaTransport",
    "AsyncKafkaTransport",
    "classify_response",
    "USER_AGENT",
]

USER_AGENT = "pipeline-python/0.1.0"
#: A status worth retrying: the server may answer differently later.
_RETRYABLE_4XX = frozenset({408, 429})
_NOT_RETRYABLE_5XX = frozenset({501, 505})
#: Kafka refusals that a retry cannot fix.
_PERMANENT_KAFKA_CODES = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.INVALID_RECORD,
    }
)


class Transport(Protocol):
    def send(self, batch: Sequence[Queued]) -> None: ...

    def close(self) -> None: ...


class AsyncTransport(Protocol):
    async def send(self, batch: Sequence[Queued]) -> None: ...

    async def aclose(self) -> None: ...


def classify_response(status: int, headers: Mapping[str, str], body: bytes) -> DeliveryError | None:
    """``None`` for a 2xx; otherwise the error, retryable for 408, 429 and 5xx but 501/505.

    >>> classify_response(503, {"Retry-After": "2"}, b"").retry_after
    2.0
    >>> classify_response(400, {}, b'{"code":"invalid_call","message":"event: is required"}').retryable
    False
    """
    if 200 <= status < 300:
        return None
    code: str | None = None
    message = body[:200].decode("utf-8", "replace")
    try:
        payload = orjson.loads(body)
        if isinstance(payload, dict):
            code = str(payload.get("code")) if payload.get("code") is not None else None
            message = str(payload.get("message", message))
    except orjson.JSONDecodeError:
        pass
    retryable = status in _RETRYABLE_4XX or (
        500 <= status < 600 and status not in _NOT_RETRYABLE_5XX
    )
    return DeliveryError(
        f"HTTP {status}" + (f" {code}" if code else "") + (f": {message}" if message else ""),
        retryable=retryable,
        status=status,
        code=code,
        retry_after=parse_retry_after(headers.get("Retry-After")) if retryable else None,
    )


class _HttpRequest:
    """The request for one batch: URL, headers and (gzipped) body, the same bytes on every try."""

    def __init__(self, endpoint: str, write_key: str, gzip: bool) -> None:
        self.url = endpoint.rstrip("/") + "/v1/batch"
        self.write_key = write_key
        self.gzip = gzip
        self.headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        if gzip:
            self.headers["Content-Encoding"] = "gzip"
        self.auth = httpx.BasicAuth(write_key, "")

    def body(self, batch: Sequence[Queued]) -> bytes:
        body = batch_body(batch, write_key=self.write_key, sent_at=format_timestamp(now_ms()))
        # Level 1: several times faster than 6 on JSON for a slightly larger body; batches are
        # limited before compression, so only bandwidth, not correctness, depends on it.
        return gzip_module.compress(body, compresslevel=1, mtime=0) if self.gzip else body


class HttpTransport:
    """``POST /v1/batch`` to the ingestion API with httpx (Basic auth, gzip)."""

    def __init__(self, write_key: str, endpoint: str, *, gzip: bool = True, timeout: float = 10.0):
        self._request = _HttpRequest(endpoint, write_key, gzip)
        self._client = httpx.Client(timeout=timeout, auth=self._request.auth)

    def send(self, batch: Sequence[Queued]) -> None:
        request = self._request
        try:
            response = self._client.post(
                request.url, content=request.body(batch), headers=request.headers
            )
        except httpx.TransportError as exc:
            raise DeliveryError(
                f"{request.url}: {type(exc).__name__}: {exc}", retryable=True
            ) from exc
        error = classify_response(response.status_code, response.headers, response.content)
        if error is not None:
            raise error

    def close(self) -> None:
        self._client.close()


class AsyncHttpTransport:
    """The asyncio twin of ``HttpTransport`` (``httpx.AsyncClient``)."""

    def __init__(self, write_key: str, endpoint: str, *, gzip: bool = True, timeout: float = 10.0):
        self._request = _HttpRequest(endpoint, write_key, gzip)
        self._client = httpx.AsyncClient(timeout=timeout, auth=self._request.auth)

    async def send(self, batch: Sequence[Queued]) -> None:
        request = self._request
        try:
            response = await self._client.post(
                request.url, content=request.body(batch), headers=request.headers
            )
        except httpx.TransportError as exc:
            raise DeliveryError(
                f"{request.url}: {type(exc).__name__}: {exc}", retryable=True
            ) from exc
        error = classify_response(response.status_code, response.headers, response.content)
        if error is not None:
            raise error

    async def aclose(self) -> None:
        await self._client.aclose()


def kafka_settings(
    bootstrap_servers: str, topic_prefix: str, schema_registry_url: str | None = None
) -> Settings:
    return Settings(
        bootstrap_servers=bootstrap_servers,
        topic_prefix=topic_prefix,
        schema_registry_url=schema_registry_url,
    )


class _KafkaRecords:
    """What both Kafka transports share: their settings and producer config, and the turning of
    queued messages into (topic, key, Avro value), stamped with the time they are written."""

    def __init__(
        self,
        bootstrap_servers: str,
        source_id: str,
        topic_prefix: str,
        timeout: float,
        config: Mapping[str, Any] | None,
        schema_registry_url: str | None,
    ) -> None:
        self.settings = kafka_settings(bootstrap_servers, topic_prefix, schema_registry_url)
        self.producer_config = producer_config(
            self.settings,
            **{"message.timeout.ms": max(1000, int(timeout * 1000)), **(config or {})},
        )
        self.topic = topics_for(self.settings).calls
        self.source_id = source_id
        self.codec = make_codec(self.settings)  # Confluent wire format when a registry is set

    def records(self, batch: Sequence[Queued]) -> list[tuple[str, bytes, bytes]]:
        now = now_ms()
        encode = self.codec.encode
        out = []
        for item in batch:
            call = item.call
            record = call_to_record(call)
            record["sourceId"] = self.source_id
            record["receivedAt"] = record["sentAt"] = now
            out.append((self.topic, call.key, encode("Call", record)))
        return out


class KafkaTransport:
    """Writes ``Call`` records to the calls topic (idempotent producer, ``acks=all``).

    ``timeout`` bounds one ``send``: librdkafka retries by itself until then, and reports every
    record that is still unacknowledged as failed, so a retry resends exactly those.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        source_id: str,
        *,
        topic_prefix: str = "",
        timeout: float = 10.0,
        config: Mapping[str, Any] | None = None,
        schema_registry_url: str | None = None,
    ) -> None:
        self._records = _KafkaRecords(
            bootstrap_servers, source_id, topic_prefix, timeout, config, schema_registry_url
        )
        self._timeout = timeout
        # Made now, not on the first send: an idempotent producer needs a moment to get its
        # producer id, and a first send that waits for it lets the queue fill meanwhile.
        self._producer: Producer | None = self._make_producer()

    def _make_producer(self) -> Producer:
        return Producer(dict(self._records.producer_config))  # a copy: never shared

    def send(self, batch: Sequence[Queued]) -> None:
        producer = self._producer = self._producer or self._make_producer()
        failed: list[tuple[int, KafkaError]] = []
        lock = threading.Lock()

        def acked(index: int) -> Any:
            def report(error: KafkaError | None, _message: Any) -> None:
                if error is not None:
                    with lock:
                        failed.append((index, error))

            return report

        for index, (topic, key, value) in enumerate(self._records.records(batch)):
            while True:
                try:
                    producer.produce(topic, value, key, on_delivery=acked(index))
                    break
                except BufferError:  # librdkafka's queue is full: let it drain
                    producer.poll(0.05)
        # Every record gets its report within message.timeout.ms; the margin covers the rest.
        remaining = producer.flush(self._timeout + 5.0)
        if not failed and not remaining:
            return
        if any(error.code() in FATAL_PRODUCER_CODES for _, error in failed):
            self._producer = None  # the next try gets a fresh producer (the old one is fenced)
        if remaining:
            raise DeliveryError(
                f"Kafka did not acknowledge {remaining} of {len(batch)} calls in time",
                retryable=True,
            )
        first = failed[0][1]
        raise DeliveryError(
            f"Kafka refused {len(failed)} of {len(batch)} calls: {first.str()}",
            retryable=first.code() not in _PERMANENT_KAFKA_CODES,
            pending=[batch[index] for index, _ in sorted(failed, key=lambda f: f[0])],
        )

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(self._timeout)
            self._producer = None


class AsyncKafkaTransport:
    """The asyncio twin of ``KafkaTransport``, on ``pipeline``'s ``AsyncProducer``."""

    def __init__(
        self,
        bootstrap_servers: str,
        source_id: str,
        *,
        topic_prefix: str = "",
        timeout: float = 10.0,
        config: Mapping[str, Any] | None = None,
        schema_registry_url: str | None = None,
    ) -> None:
        self._records = _KafkaRecords(
            bootstrap_servers, source_id, topic_prefix, timeout, config, schema_registry_url
        )
        self._timeout = timeout
        self._producer: AsyncProducer | None = self._make_producer()  # now: see KafkaTransport

    def _make_producer(self) -> AsyncProducer:
        records = self._records
        return AsyncProducer(records.settings, producer=Producer(dict(records.producer_config)))

    async def send(self, batch: Sequence[Queued]) -> None:
        if self._producer is None:
            self._producer = self._make_producer()
        if (
            self._records.settings.schema_registry_url
        ):  # encoding may ask the registry: not on the loop
            records = await asyncio.to_thread(self._records.records, batch)
        else:
            records = self._records.records(batch)
        failed = await self._producer.send_all(records)
        if not failed:
            return
        if any(failure.refusal.fatal for failure in failed):
            broken, self._producer = self._producer, None  # fenced: the next try gets a new one
            await asyncio.to_thread(broken.close, 0.0)
        index = {value: i for i, (_, _, value) in enumerate(records)}
        raise DeliveryError(
            f"Kafka refused {len(failed)} of {len(batch)} calls: {failed[0][1]}",
            retryable=True,
            pending=[batch[index[record[2]]] for record, _ in failed if record[2] in index],
        )

    async def aclose(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await asyncio.to_thread(producer.close, self._timeout)
