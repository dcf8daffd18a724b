"""Webhook POSTs through pyreqwest (Rust's reqwest on tokio, with rustls): the event loop's
thread spends some 22 µs a request there against aiohttp's 140 (``bench/http_clients.py``).
``PIPELINE_HTTP_CLIENT=reqwest`` sends through it every request whose destination has no TLS
settings or proxy of its own; those stay on aiohttp (reqwest cannot trust a given CA alone).

The SSRF guard holds by pinning: a host name is resolved here by the guarded resolver (which
drops refused addresses and fails when none is left), and the host's own client connects to
the first allowed address only, for ``PIN_SECONDS``; the name still goes in SNI and ``Host``.
An IP literal was judged when its URL was first seen (``WebhookSender._target``). Redirects are
not followed, nothing is decompressed, no cookie is kept, and at most ``max_bytes`` of an
answer are read.

The clients run on tokio's multi-threaded runtime (``threads`` worker threads, one runtime a
process) unless ``threads`` is 1. Each answer is handed to the event loop under the GIL, so the
runtime thread that has it waits while the loop runs Python; on pyreqwest's single-threaded
runtime every other socket waited with it, and a busy worker's requests to a 100 ms receiver
took twice that.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from datetime import timedelta

from pyreqwest.client import Client, ClientBuilder
from pyreqwest.exceptions import (
    BodyDecodeError,
    ConnectError,
    DecodeError,
    DetailedPyreqwestError,
    PyreqwestError,
    RequestTimeoutError,
)
from pyreqwest.runtime import runtime_worker_threads

from pipeline.core.outcomes import Failure, UrlResult
from pipeline.http.address_guard import BlockedAddressError, GuardedResolver, is_ip_literal
from pipeline.http.answers import answered, unanswered

__all__ = ["PIN_SECONDS", "ReqwestPoster"]

log = logging.getLogger(__name__)

#: How long a host name stays pinned to the address it resolved to (aiohttp's DNS cache in the
#: sender lasts as long).
PIN_SECONDS = 60.0
#: The words of a failed connection's causes that mean its TLS handshake failed.
_TLS_WORDS = ("certificate", "tls", "handshake", "ssl")


class _Pin:
    __slots__ = ("address", "client", "until")

    def __init__(self, address: str, client: Client, until: float) -> None:
        self.address = address
        self.client = client
        self.until = until


class ReqwestPoster:
    """POSTs and what their answers mean, as ``WebhookSender.post`` does with aiohttp."""

    def __init__(
        self,
        resolver: GuardedResolver,
        timeout: float,
        *,
        max_bytes: int,
        threads: int = 1,
    ) -> None:
        self._resolver = resolver
        self._timeout = timeout
        self._max_bytes = max_bytes
        self._threads = threads
        self._literal: Client | None = None  # for URLs whose host is an IP address
        self._pins: dict[str, _Pin] = {}
        self._pinning: dict[str, asyncio.Task[Client]] = {}
        self._retired: set[asyncio.Task[None]] = set()

    async def start(self) -> ReqwestPoster:
        if self._threads > 1:
            _runtime_threads(self._threads)
        self._literal = await self._client()
        return self

    async def _client(self, host: str = "", address: str = "", port: int = 0) -> Client:
        """A new client (pinning ``host`` to ``address``). Built on a thread: a build loads the
        system's trusted certificates, some 10 ms."""
        builder = (
            ClientBuilder()
            .follow_redirects(False)
            .timeout(timedelta(seconds=self._timeout))
            .gzip(False)
            .brotli(False)
            .zstd(False)
            .deflate(False)
            .runtime_multithreaded(self._threads > 1)
        )
        if host:
            builder = builder.resolve(host, address, port)
        return await asyncio.to_thread(builder.build)

    async def _client_for(self, host: str, port: int) -> Client:
        """The client that reaches ``host`` (``BlockedAddressError``, ``OSError``: none may)."""
        if is_ip_literal(host):
            assert self._literal is not None, "ReqwestPoster.start() was not awaited"
            return self._literal
        pin = self._pins.get(host)
        if pin is not None and pin.until > time.monotonic():
            return pin.client
        pinning = self._pinning.get(host)  # the requests that find it expired wait for one
        if pinning is None:
            pinning = self._pinning[host] = asyncio.create_task(self._pin(host, port))
            pinning.add_done_callback(lambda _: self._pinning.pop(host, None))
        return await asyncio.shield(pinning)

    async def _pin(self, host: str, port: int) -> Client:
        allowed = [r["host"] for r in await self._resolver.resolve(host, port, socket.AF_UNSPEC)]
        pin = self._pins.get(host)
        if pin is not None and pin.address in allowed:  # the same address: the same pool
            pin.until = time.monotonic() + PIN_SECONDS
            return pin.client
        client = await self._client(host, allowed[0], port)
        self._pins[host] = _Pin(allowed[0], client, time.monotonic() + PIN_SECONDS)
        if pin is not None:  # its requests in flight end within the timeout
            retired = asyncio.create_task(self._close_later(pin.client))
            self._retired.add(retired)
            retired.add_done_callback(self._retired.discard)
        return client

    async def _close_later(self, client: Client) -> None:
        await asyncio.sleep(self._timeout + 1.0)
        await client.close()

    async def post(
        self, url: str, host: str, port: int, headers: dict[str, str], body: bytes
    ) -> UrlResult:
        started = time.monotonic()
        try:
            client = await self._client_for(host, port)
            request = client.post(url).headers(headers).body_bytes(body).build_streamed()
            async with request as response:
                read = await response.body_reader.read(self._max_bytes)  # frees the connection
                body = b"" if read is None else bytes(read)
                return answered(url, response.status, response.headers, body, started)
        except (PyreqwestError, OSError) as exc:
            return unanswered(url, *self.failure_of(exc), started)

    def failure_of(self, exc: BaseException) -> tuple[Failure, str]:
        """What an exception of a request means, and its words."""
        if isinstance(exc, BlockedAddressError):
            return Failure.BLOCKED_ADDRESS, str(exc)
        if isinstance(exc, RequestTimeoutError):
            return Failure.TIMEOUT, f"no answer within {self._timeout:g} s"
        if isinstance(exc, ConnectError):
            cause = _cause(exc)
            if any(word in cause.lower() for word in _TLS_WORDS):
                return Failure.TLS_ERROR, cause
            return Failure.CONNECTION_ERROR, cause
        if isinstance(exc, DecodeError | BodyDecodeError):
            return Failure.BAD_RESPONSE, _cause(exc)
        if isinstance(exc, PyreqwestError):
            return Failure.CONNECTION_ERROR, _cause(exc)
        return Failure.CONNECTION_ERROR, f"{type(exc).__name__}: {exc}"  # resolving failed

    async def aclose(self) -> None:
        for task in (*self._pinning.values(), *self._retired):
            task.cancel()
        clients = [pin.client for pin in self._pins.values()]
        if self._literal is not None:
            clients.append(self._literal)
        self._pins.clear()
        self._literal = None
        for client in clients:
            await client.close()


def _runtime_threads(threads: int) -> None:
    """Ask for ``threads`` worker threads of the process's multi-threaded runtime; once it runs
    it keeps its own (a second sender in the process, asking for another count, is told so)."""
    try:
        runtime_worker_threads(threads)
    except RuntimeError:
        log.warning(
            "the HTTP client's runtime is running already: it keeps its threads, not %d", threads
        )


def _cause(exc: PyreqwestError) -> str:
    """The innermost cause's words (reqwest's own message is a generic "error sending
    request"), after the exception's kind."""
    causes = exc.details.get("causes") if isinstance(exc, DetailedPyreqwestError) else None
    words = causes[-1]["message"] if causes else str(exc)
    return f"{type(exc).__name__}: {words}"
