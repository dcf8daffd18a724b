"""Webhook POSTs over HTTP/1.1 on the event loop's own connections, answers parsed by httptools
(llhttp, Node's parser, in C): some 14 µs of CPU a request against pyreqwest's 49 (of which 30 on
its runtime's threads) and aiohttp's 75-90 (``bench/http_clients.py``). No other thread takes
part, so no answer waits for the GIL or wakes a thread. ``PIPELINE_HTTP_CLIENT=httptools`` sends
through it every request whose destination has no TLS settings or proxy of its own; those stay
on aiohttp.

What it does is narrow, which is why it is small: a POST with a body of known length, one
request at a time on a connection, kept alive for the next (a host's connection count is
already bounded by the sender's slots). Redirects are not followed, nothing is decompressed, no
cookie is kept, and at most ``max_bytes`` of an answer are read (an answer longer than that ends
its connection). A reused connection that the receiver closed before it answered a byte (it
timed out its idle connections as we sent) is replaced once by a new one, as browsers and
reqwest do; on a new connection that is a failure. Bytes after the answer awaited (a stray
answer, a 408 to an idle connection) end the connection, so they never answer the next request;
an answer cut short by the connection's end counts with the status it came with. Connections
idle for ``IDLE_SECONDS`` are closed, and a host no longer sent to is forgotten.

The SSRF guard holds by pinning, as with reqwest: a host name is resolved by the guarded resolver
(which drops refused addresses and fails when none is left) and its connections go to the first
allowed address, for ``PIN_SECONDS``; the name still goes in SNI and ``Host``. An IP literal was
judged when its URL was first seen (``WebhookSender._target``). HTTPS verifies the receiver's
certificate with the sender's TLS context (the system's CAs).
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
import time
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

from pipeline.core.outcomes import Failure, UrlResult
from pipeline.http.address_guard import BlockedAddressError, GuardedResolver, is_ip_literal
from pipeline.http.answers import answered, unanswered

__all__ = ["IDLE_SECONDS", "PIN_SECONDS", "H1Poster"]

#: How long a host name stays pinned to the address it resolved to.
PIN_SECONDS = 60.0
#: A connection idle longer than this is closed rather than used again (receivers close theirs
#: after 5 s (Node) to 75 s (nginx); one closed while idle is dropped as soon as it is seen).
IDLE_SECONDS = 30.0
#: How often answers past their deadline are looked for (at most; a tenth of the timeout if
#: that is less): a request gives up this much after its timeout at most.
SWEEP_SECONDS = 0.1
_NO_HEADERS: Mapping[str, str] = {}


class BadAnswer(Exception):
    """The receiver's bytes are not an HTTP/1.1 answer."""


class _Closed(ConnectionError):
    """The connection ended before its answer did (``stale``: before a byte of it came, on a
    connection that had served a request before)."""

    def __init__(self, words: str, stale: bool) -> None:
        super().__init__(words)
        self.stale = stale


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its answer parsed as it comes."""

    __slots__ = (
        "_answer",
        "_body",
        "_cap",
        "_heard",
        "_kept",
        "_parser",
        "_retry_after",
        "_status",
        "deadline",
        "_transport",
        "closed",
        "idle_since",
        "reusable",
        "served",
    )

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._answer: asyncio.Future[int] | None = None
        self.deadline = 0.0  # the event loop's time by which the answer must have come
        self._body: list[bytes] = []
        self._heard = 0  # bytes of the current answer received
        self._kept = 0  # bytes of its body kept
        self._status = 0
        self._retry_after: bytes | None = None
        self.closed = False
        self.reusable = False  # the answer allows another request on this connection
        self.served = 0  # requests answered on it
        self.idle_since = 0.0

    # ---- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of it

    def data_received(self, data: bytes) -> None:
        answer = self._answer
        if answer is None or answer.done():  # bytes nobody asked for: never trust it again
            self._stray()
            return
        self._heard += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(BadAnswer(f"{type(exc).__name__}: {exc}"))
        except httptools.HttpParserUpgrade:  # a 101: not an answer to a POST
            self._fail(BadAnswer("the receiver switched protocols (101) unasked"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        answer = self._answer
        if answer is None or answer.done():
            return
        if self._status >= 200:  # an answer read until the connection's end
            self._done()
            return
        stale = self._heard == 0 and self.served > 0
        words = "the receiver closed the connection before it answered"
        self._fail(_Closed(words if exc is None else f"{words}: {exc}", stale))

    # ---- httptools' callbacks

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) == 11 and name.lower() == b"retry-after":
            self._retry_after = value

    def on_message_begin(self) -> None:
        answer = self._answer
        if answer is None or answer.done():  # a second answer after the one awaited
            self._stray()

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        self.reusable = self._parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._kept += len(body)
        if self._kept >= self._cap:  # enough: the rest is not read
            self.reusable = False
            self._done()

    def on_message_complete(self) -> None:
        if self._status < 200:  # 100 Continue and its kin: the answer follows
            self._status = 0
            return
        self._done()

    # ---- a request

    def request(self, data: bytes, deadline: float) -> asyncio.Future[int]:
        """Send ``data`` (a whole request); the answer's status, once it has come."""
        assert self._transport is not None
        loop = asyncio.get_running_loop()
        self._answer = answer = loop.create_future()
        self._body = []
        self._heard = self._kept = self._status = 0
        self._retry_after = None
        self.reusable = False
        self.deadline = deadline
        self._transport.write(data)
        return answer

    def body(self) -> bytes:
        return b"".join(self._body)

    def headers(self) -> Mapping[str, str]:
        if self._retry_after is None:
            return _NO_HEADERS
        return {"Retry-After": self._retry_after.decode("latin-1")}

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    def abort(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.abort()

    def fresh(self, since: float) -> bool:
        """Open, and idle since ``since`` (monotonic seconds) or later: fit to be used again."""
        return not self.closed and self.idle_since >= since

    def _stray(self) -> None:
        """The receiver sent more than the answer awaited: a later request on this connection
        would read it as its own answer, so the connection ends."""
        self.reusable = False
        self.close()

    def give_up(self, exc: BaseException) -> None:
        """Its answer will not be awaited (``exc`` says why): the connection ends with it."""
        self._fail(exc)
        self.abort()

    def _done(self) -> None:
        answer = self._answer
        if answer is not None and not answer.done():
            self.served += 1
            answer.set_result(self._status)

    def _fail(self, exc: BaseException) -> None:
        self.reusable = False
        answer = self._answer
        if answer is not None and not answer.done():
            answer.set_exception(exc)
        self.close()


class _Route:
    """One webhook URL, worked out once: where it connects and its request's first lines."""

    __slots__ = ("host", "key", "port", "start", "tls")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or ""
        self.tls = parts.scheme == "https"
        default = 443 if self.tls else 80
        self.port = parts.port or default
        self.key = (self.host, self.port, self.tls)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        name = f"[{self.host}]" if ":" in self.host else self.host
        host = name if self.port == default else f"{name}:{self.port}"
        self.start = f"POST {target} HTTP/1.1\r\nHost: {host}\r\n".encode()


class _Pool:
    """A host's idle connections, and the address its name is pinned to."""

    __slots__ = ("address", "idle", "until")

    def __init__(self, address: str, until: float) -> None:
        self.address = address
        self.until = until
        self.idle: collections.deque[_Connection] = collections.deque()

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()


class H1Poster:
    """POSTs and what their answers mean, as ``WebhookSender.post`` does with aiohttp."""

    def __init__(
        self,
        resolver: GuardedResolver,
        timeout: float,
        *,
        max_bytes: int,
        ssl_context: ssl.SSLContext,
    ) -> None:
        self._resolver = resolver
        self._timeout = timeout
        self._max_bytes = max_bytes
        self._ssl = ssl_context
        self._routes: dict[str, _Route] = {}
        self._pools: dict[tuple[str, int, bool], _Pool] = {}
        self._pinning: dict[tuple[str, int, bool], asyncio.Task[_Pool]] = {}
        #: Connections awaiting an answer, and the timer that gives up on those past their
        #: deadline (one for them all: a timer a request cost uvloop some 2.5 µs).
        self._waiting: set[_Connection] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._sweep_every = min(SWEEP_SECONDS, timeout / 10)
        self._next_tidy = 0.0

    async def post(
        self, url: str, host: str, port: int, headers: dict[str, str], body: bytes
    ) -> UrlResult:
        started = time.monotonic()
        deadline = asyncio.get_running_loop().time() + self._timeout
        route = self._routes.get(url)
        if route is None:
            if len(self._routes) >= 10_000:
                self._routes.clear()
            route = self._routes[url] = _Route(url)
        lines = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
        count = len(headers)
        if lines.count("\n") != count or lines.count("\r") != count or "\0" in lines:
            detail = "a header name or value holds a line break or NUL"
            return unanswered(url, Failure.CONNECTION_ERROR, detail, started)
        data = b"%b%bContent-Length: %d\r\n\r\n%b" % (
            route.start,
            lines.encode(),
            len(body),
            body,
        )
        try:
            pool = await self._pool(route, deadline)
            connection = self._idle(pool)
            if connection is not None:
                try:
                    status = await self._ask(connection, data, deadline)
                except _Closed as exc:
                    if not exc.stale:
                        raise
                    connection = None
            if connection is None:
                connection = await self._connect(route, pool.address, deadline)
                status = await self._ask(connection, data, deadline)
        except (OSError, BadAnswer) as exc:  # TimeoutError and ssl.SSLError are OSErrors
            return unanswered(url, *self.failure_of(exc), started)
        result = answered(url, status, connection.headers(), connection.body(), started)
        if connection.reusable and not connection.closed and self._pools.get(route.key) is pool:
            connection.idle_since = time.monotonic()
            pool.idle.append(connection)
        else:
            connection.close()
        return result

    async def _ask(self, connection: _Connection, data: bytes, deadline: float) -> int:
        """``connection``'s answer to ``data``; a request given up (cancelled) ends its
        connection."""
        self._waiting.add(connection)
        if self._sweeper is None:
            loop = asyncio.get_running_loop()
            self._sweeper = loop.call_later(self._sweep_every, self._sweep)
        try:
            return await connection.request(data, deadline)
        except asyncio.CancelledError:
            connection.abort()
            raise
        finally:
            self._waiting.discard(connection)

    def _sweep(self) -> None:
        """Give up on the answers past their deadline; again later while any are awaited."""
        self._sweeper = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for connection in [c for c in self._waiting if c.deadline <= now]:
            connection.give_up(TimeoutError())
        if now >= self._next_tidy:
            self._next_tidy = now + IDLE_SECONDS / 2
            self._tidy()
        if self._waiting:
            self._sweeper = loop.call_later(self._sweep_every, self._sweep)

    def _tidy(self) -> None:
        """Close the connections idle too long, and forget the hosts whose pin has expired with
        none left (a host no longer sent to keeps no sockets open)."""
        stale = time.monotonic() - IDLE_SECONDS
        for key, pool in list(self._pools.items()):
            while pool.idle and not pool.idle[0].fresh(stale):
                pool.idle.popleft().close()  # the oldest are on the left
            if not pool.idle and pool.until < stale:
                del self._pools[key]

    def _idle(self, pool: _Pool) -> _Connection | None:
        """The most recently used idle connection still open and fresh (older ones closed)."""
        since = time.monotonic() - IDLE_SECONDS
        while pool.idle:
            connection = pool.idle.pop()
            if connection.fresh(since):
                return connection
            connection.close()
        return None

    async def _connect(self, route: _Route, address: str, deadline: float) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = self._ssl if route.tls else None
        async with asyncio.timeout_at(deadline):
            _, connection = await loop.create_connection(
                lambda: _Connection(self._max_bytes),
                address,
                route.port,
                ssl=tls,
                server_hostname=route.host if tls is not None else None,
            )
        return connection

    async def _pool(self, route: _Route, deadline: float) -> _Pool:
        """The pool of ``route``'s host, pinned to an allowed address (``BlockedAddressError``,
        ``OSError``: none may be reached)."""
        pool = self._pools.get(route.key)
        if pool is not None and pool.until > time.monotonic():
            return pool
        if is_ip_literal(route.host):  # judged already: kept while it is used
            if pool is None:
                pool = self._pools[route.key] = _Pool(route.host, 0.0)
            pool.until = time.monotonic() + PIN_SECONDS
            return pool
        pinning = self._pinning.get(route.key)  # the requests that find it expired wait for one
        if pinning is None:
            key = route.key
            pinning = self._pinning[key] = asyncio.create_task(self._pin(route))
            pinning.add_done_callback(lambda _: self._pinning.pop(key, None))
        try:
            async with asyncio.timeout_at(deadline):
                return await asyncio.shield(pinning)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if pinning.cancelled() and task is not None and not task.cancelling():
                raise ConnectionError("the sender was closed") from None  # by aclose
            raise

    async def _pin(self, route: _Route) -> _Pool:
        resolved = await self._resolver.resolve(route.host, route.port, socket.AF_UNSPEC)
        allowed = [result["host"] for result in resolved]
        pool = self._pools.get(route.key)
        if pool is not None and pool.address in allowed:  # the same address: the same pool
            pool.until = time.monotonic() + PIN_SECONDS
            return pool
        if pool is not None:  # its requests in flight end on their own; no new ones on it
            pool.close()
        pool = self._pools[route.key] = _Pool(allowed[0], time.monotonic() + PIN_SECONDS)
        return pool

    def failure_of(self, exc: BaseException) -> tuple[Failure, str]:
        """What an exception of a request means, and its words."""
        if isinstance(exc, BlockedAddressError):
            return Failure.BLOCKED_ADDRESS, str(exc)
        if isinstance(exc, TimeoutError):
            return Failure.TIMEOUT, f"no answer within {self._timeout:g} s"
        if isinstance(exc, ssl.SSLError | ssl.CertificateError):
            return Failure.TLS_ERROR, f"{type(exc).__name__}: {exc}"
        if isinstance(exc, BadAnswer):
            return Failure.BAD_RESPONSE, str(exc)
        return Failure.CONNECTION_ERROR, f"{type(exc).__name__}: {exc}"

    async def aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for task in self._pinning.values():
            task.cancel()
        for connection in list(self._waiting):  # no sweep is left to end them
            connection.give_up(ConnectionError("the sender was closed"))
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
