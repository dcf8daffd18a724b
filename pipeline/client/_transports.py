"""How batches leave the process: HTTP to the ingestion API (here), or Kafka directly
(``_kafka.py``, imported only by a client that uses it: it loads confluent-kafka and fastavro).

Every transport has one method that matters, ``send(batch)``: it returns once the whole batch is
acknowledged (HTTP 2xx; Kafka acks from every in-sync replica) or raises ``DeliveryError`` saying
whether a retry may help. Batching, retries and timing live above, in the client, and are the same
for every transport.
"""

from __future__ import annotations

import gzip as gzip_module
from collections.abc import Mapping, Sequence
from typing import Protocol

import httpx
import orjson

from pipeline.core.timestamps import format_timestamp, now_ms

from ._backoff import parse_retry_after
from ._batches import batch_body
from ._errors import DeliveryError
from ._messages import Queued

__all__ = [
    "Transport",
    "AsyncTransport",
    "HttpTransport",
    "AsyncHttpTransport",
    "classify_response",
    "USER_AGENT",
]

USER_AGENT = "pipeline-python/0.1.0"
#: A status worth retrying: the server may answer differently later.
_RETRYABLE_4XX = frozenset({408, 429})
_NOT_RETRYABLE_5XX = frozenset({501, 505})


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

    def headers_for(self, batch: Sequence[Queued]) -> dict[str, str]:
        """The request's headers: with the calls' trace context when they all share one (a
        batch of calls made in different spans carries none: it would name one of them)."""
        trace = batch[0].trace if batch else ()
        if not trace or any(item.trace != trace for item in batch):
            return self.headers
        return {**self.headers, **{name: value.decode() for name, value in trace}}

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
                request.url, content=request.body(batch), headers=request.headers_for(batch)
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
                request.url, content=request.body(batch), headers=request.headers_for(batch)
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
