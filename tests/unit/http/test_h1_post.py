"""``PIPELINE_HTTP_CLIENT=httptools`` (``pipeline.http.h1_post``), what the shared tests of the fast
clients (``test_fast_posters``) do not cover: the bytes it sends, connections kept alive and
replaced, answers of every framing, answers too long, timeouts, TLS with the sender's context,
pinning. Real servers on 127.0.0.1: scripted byte by byte where the framing is the point."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import trustme
from aiohttp import web

from pipeline.core.config import Destination
from pipeline.core.outcomes import Failure, UrlResult
from pipeline.core.settings import Settings
from pipeline.http import h1_post
from pipeline.http.sender import WebhookSender
from tests.unit.http._receiving import sender_and_server

SETTINGS = Settings(
    http_client="httptools", allowed_networks=("127.0.0.0/8",), delivery_timeout=1.0
)

#: A scripted connection: (its number from 0, its reader, its writer).
Script = Callable[[int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def request_of(reader: asyncio.StreamReader) -> bytes:
    """One whole request (its head and its ``Content-Length`` body); b"" at the end."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return b""
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head + await reader.readexactly(length)


@asynccontextmanager
async def scripted(script: Script) -> AsyncIterator[str]:
    """A server on 127.0.0.1 running ``script`` on each connection; its base URL."""
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        number, connections = connections, connections + 1
        try:
            await script(number, reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


def answer(status: int, body: bytes = b"ok", *extra: bytes) -> bytes:
    head = [b"HTTP/1.1 %d X" % status, b"Content-Length: %d" % len(body), *extra]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def answered_once(data: bytes) -> Script:
    """A script that answers each connection's first request with ``data`` and reads the next
    one, unanswered (the connection then closes without a byte)."""

    async def script(_: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await request_of(reader)
        writer.write(data)
        await writer.drain()
        await request_of(reader)

    return script


async def post(sender: WebhookSender, url: str) -> UrlResult:
    hooks = Destination(id="d", sources=["web"], webhooks=[{"url": url}])
    [result] = await sender.attempt(hooks, b'{"a":1}', "m1")
    return result


def connections_seen() -> tuple[set[object], Callable[[web.Request], Awaitable[web.Response]]]:
    """A handler answering 200 ``ok``, and the connections (transports) its requests came on."""
    peers: set[object] = set()

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        peers.add(request.transport)
        return web.Response(text="ok")

    return peers, handle


def poster_of(sender: WebhookSender) -> h1_post.H1Poster:
    """The sender's httptools client (it has one with these settings)."""
    poster = sender._poster
    assert isinstance(poster, h1_post.H1Poster)
    return poster


def run(test: Callable[[WebhookSender], Awaitable[None]], settings: Settings = SETTINGS) -> None:
    async def go() -> None:
        sender = await WebhookSender(settings).start()
        try:
            poster_of(sender)  # the httptools client is the one tested
            await test(sender)
        finally:
            await sender.aclose()

    asyncio.run(go())


def test_the_request_on_the_wire() -> None:
    """The request line keeps the path and query, ``Host`` names the host as the URL does, the
    headers the sender gives go as they are, and the body follows its ``Content-Length``."""

    async def test(sender: WebhookSender) -> None:
        got: list[bytes] = []

        async def script(
            _: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            got.append(await request_of(reader))
            writer.write(answer(200))
            await writer.drain()

        async with scripted(script) as base:
            result = await post(sender, f"{base}/hook/a?token=t%20x")
        assert result.status == 200
        head, body = got[0].split(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        assert lines[0] == b"POST /hook/a?token=t%20x HTTP/1.1"
        assert lines[1] == b"Host: " + base.removeprefix("http://").encode()
        assert b"Content-Type: application/json" in lines
        assert b"Content-Length: 7" in lines and body == b'{"a":1}'
        assert any(line.startswith(b"User-Agent: pipeline") for line in lines)
        assert not any(line.lower().startswith(b"accept-encoding") for line in lines)

    run(test)


def test_a_connection_is_kept_alive_and_a_host_gets_no_more_than_its_requests_in_flight() -> None:
    """20 requests one after another go over one connection; 10 at once open 10 at most."""
    peers, handle = connections_seen()

    async def go() -> None:
        async with sender_and_server(handle, SETTINGS) as (sender, port):
            url = f"http://127.0.0.1:{port}/h"
            for _ in range(20):
                assert (await post(sender, url)).status == 200
            assert len(peers) == 1
            results = await asyncio.gather(*(post(sender, url) for _ in range(10)))
            assert [r.status for r in results] == [200] * 10
            assert 1 < len(peers) <= 10

    asyncio.run(go())


def test_a_kept_connection_the_receiver_closed_is_replaced_once() -> None:
    """The receiver answers once on each connection and closes the next request's connection
    without a byte (its idle timeout raced our request): the request goes again on a new
    connection, once. A new connection closed without an answer is a failure, not retried."""

    async def test(sender: WebhookSender) -> None:
        # The second request on each connection: closed unanswered.
        async with scripted(answered_once(answer(200))) as base:
            for _ in range(3):
                result = await post(sender, f"{base}/h")
                assert (result.status, result.failure) == (200, None)

        tries = 0

        async def never(_: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal tries
            tries += 1
            await request_of(reader)

        async with scripted(never) as base:
            result = await post(sender, f"{base}/h")
        assert (result.status, result.failure) == (None, Failure.CONNECTION_ERROR)
        assert "closed the connection before it answered" in result.detail
        assert tries == 1

    run(test)


def test_answers_of_every_framing() -> None:
    """A chunked answer, one read until the connection ends (with ``Retry-After``), and one after
    a ``100 Continue``: each read whole, its snippet and status kept."""
    framings = [
        b"HTTP/1.1 500 X\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        b"HTTP/1.1 503 X\r\nConnection: close\r\nRetry-After: 3\r\n\r\nbusy, later",
        b"HTTP/1.1 100 Continue\r\n\r\n" + answer(201, b""),
    ]

    async def test(sender: WebhookSender) -> None:
        async def script(
            number: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            await request_of(reader)
            writer.write(framings[number])
            await writer.drain()

        async with scripted(script) as base:
            chunked = await post(sender, f"{base}/h")
            until_closed = await post(sender, f"{base}/h")
            continued = await post(sender, f"{base}/h")
        assert (chunked.status, chunked.failure, chunked.detail) == (
            500,
            Failure.SERVER_ERROR,
            "hello world",
        )
        assert (until_closed.status, until_closed.retry_after) == (503, 3.0)
        assert until_closed.detail == "busy, later"
        assert (continued.status, continued.failure) == (201, None)

    run(test)


def test_a_long_answer_is_read_no_further_than_the_limit_and_ends_its_connection() -> None:
    """4 MB of answer: the snippet is its start, at most 64 KiB (and a chunk) were kept, and
    the connection is not used again (its rest was never read)."""
    kept: list[int] = []

    async def test(sender: WebhookSender) -> None:
        poster = poster_of(sender)
        async with scripted(answered_once(answer(500, b"start " + b"x" * 4_000_000))) as base:
            first = await post(sender, f"{base}/h")
            [pool] = poster._pools.values()
            kept.append(len(pool.idle))
        assert first.status == 500 and first.detail.startswith("start xxx")

    run(test)
    assert kept == [0]


def test_a_request_past_the_timeout_ends_its_connection() -> None:
    """Given up within a sweep of its timeout (one timer looks for them all, and stops once
    nothing is awaited); the connection is not used again."""

    async def test(sender: WebhookSender) -> None:
        async def late(
            number: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            await request_of(reader)
            if number == 0:
                await asyncio.sleep(1.5)
            writer.write(answer(200))
            await writer.drain()
            await request_of(reader)

        async with scripted(late) as base:
            timed_out = await post(sender, f"{base}/h")
            assert (timed_out.failure, timed_out.detail) == (
                Failure.TIMEOUT,
                "no answer within 1 s",
            )
            assert timed_out.duration < 1.5
            assert (await post(sender, f"{base}/h")).status == 200  # on a new connection
        poster = poster_of(sender)
        await asyncio.sleep(0.3)  # a sweep finds nothing awaited: no timer left running
        assert poster._sweeper is None and not poster._waiting

    run(test)


def test_a_header_with_a_line_break_is_never_sent() -> None:
    """The config refuses such headers; the client refuses them again rather than let a value
    start a second request on the connection."""

    async def test(sender: WebhookSender) -> None:
        got: list[bytes] = []

        async def script(
            _: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            got.append(await reader.read(1024))

        poster = poster_of(sender)
        async with scripted(script) as base:
            result = await poster.post(
                f"{base}/h", "127.0.0.1", 0, {"X-A": "1\r\n\r\nPOST /other HTTP/1.1"}, b"{}"
            )
        assert (result.status, result.failure) == (None, Failure.CONNECTION_ERROR)
        assert "line break" in result.detail
        assert got == []

    run(test)


def test_https_verifies_the_receiver_by_the_senders_tls_context_and_name() -> None:
    """A receiver whose certificate the sender's context trusts is reached by its name (SNI and
    the name checked); the same receiver under a name its certificate lacks is a TLS error."""
    authority = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost").configure_cert(server_context)
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        seen.append(request.host)
        return web.Response(text="ok")

    async def go() -> None:
        app = web.Application()
        app.router.add_post("/h", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        sender = await WebhookSender(SETTINGS, ssl_context=trusting).start()
        try:
            named = await post(sender, f"https://localhost:{port}/h")
            assert (named.status, named.failure) == (200, None)
            wrong_name = await post(sender, f"https://127.0.0.1:{port}/h")
            assert (wrong_name.status, wrong_name.failure) == (None, Failure.TLS_ERROR)
        finally:
            await sender.aclose()
            await runner.cleanup()
        assert seen == [f"localhost:{port}"]

    asyncio.run(go())


def test_a_host_is_pinned_once_and_keeps_its_connections_while_its_address_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Many first requests to a host wait for one resolution; once its pin expires the host is
    judged again, and the same address keeps the same pool (and its connections)."""
    peers, handle = connections_seen()

    async def go() -> None:
        async with sender_and_server(handle, SETTINGS) as (sender, port):
            poster = poster_of(sender)
            resolved: list[str] = []
            resolve = poster._resolver.resolve

            async def counted(host: str, port: int = 0, family: object = None) -> object:
                resolved.append(host)
                return await resolve(host, port, family)  # type: ignore[arg-type]

            monkeypatch.setattr(poster._resolver, "resolve", counted)
            url = f"http://localhost:{port}/h"
            results = await asyncio.gather(*(post(sender, url) for _ in range(5)))
            assert [r.status for r in results] == [200] * 5
            assert resolved == ["localhost"]
            [pool] = poster._pools.values()
            assert pool.address == "127.0.0.1" and len(pool.idle) == len(peers)
            pool.until = 0.0  # expired: judged again on the next request
            assert (await post(sender, url)).status == 200
            assert resolved == ["localhost", "localhost"]
            assert [*poster._pools.values()] == [pool] and len(peers) <= 5

    asyncio.run(go())


def test_an_answer_with_connection_close_is_the_last_on_its_connection() -> None:
    """The receiver says ``Connection: close`` and keeps the socket open: the next request goes
    on a new connection (on the old one it would wait for nothing)."""

    async def test(sender: WebhookSender) -> None:
        async def script(
            _: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            await request_of(reader)
            writer.write(answer(200, b"ok", b"Connection: close"))
            await writer.drain()
            await request_of(reader)
            await asyncio.sleep(3)  # never answered

        async with scripted(script) as base:
            for _ in range(2):
                result = await post(sender, f"{base}/h")
                assert (result.status, result.failure) == (200, None)

    run(test)


def test_a_request_awaiting_its_answer_when_the_sender_closes_ends_at_once() -> None:
    async def test(sender: WebhookSender) -> None:
        async def silent(
            _: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            await request_of(reader)
            await asyncio.sleep(3)

        poster = poster_of(sender)
        async with scripted(silent) as base:
            pending = asyncio.create_task(poster.post(f"{base}/h", "127.0.0.1", 0, {}, b"{}"))
            await wait_until(lambda: bool(poster._waiting))
            await poster.aclose()
            result = await asyncio.wait_for(pending, 0.5)  # not the 1 s timeout
        assert (result.status, result.failure) == (None, Failure.CONNECTION_ERROR)
        assert "sender was closed" in result.detail

    run(test)


async def wait_until(condition: Callable[[], bool]) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not within 2 s")


def test_bytes_after_an_answer_end_the_connection_rather_than_answer_the_next_request() -> None:
    """A receiver that sends a stray answer after the one asked for (or a 408 to an idle
    connection): the next request goes on a new connection and gets its own answer."""

    async def test(sender: WebhookSender) -> None:
        async def stray(
            number: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            await request_of(reader)
            writer.write(answer(200 if number == 0 else 201))
            await writer.drain()
            if number == 0:
                await asyncio.sleep(0.02)
                writer.write(answer(500, b"stray"))
                await writer.drain()
            await request_of(reader)
            writer.write(answer(202))
            await writer.drain()
            await request_of(reader)

        async with scripted(stray) as base:
            first = await post(sender, f"{base}/h")
            await asyncio.sleep(0.1)
            second = await post(sender, f"{base}/h")
        assert (first.status, second.status) == (200, 201)

    run(test)


def test_a_protocol_switch_is_a_bad_answer() -> None:
    async def test(sender: WebhookSender) -> None:
        switch = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"
        async with scripted(answered_once(switch)) as base:
            result = await post(sender, f"{base}/h")
        assert (result.status, result.failure) == (None, Failure.BAD_RESPONSE)
        assert "101" in result.detail

    run(test)


def test_idle_connections_and_hosts_no_longer_used_are_let_go() -> None:
    async def test(sender: WebhookSender) -> None:
        poster = poster_of(sender)
        async with scripted(answered_once(answer(200))) as base:
            assert (await post(sender, f"{base}/h")).status == 200
            [pool] = poster._pools.values()
            [connection] = pool.idle
            poster._tidy()
            assert [*poster._pools.values()] == [pool] and not connection.closed  # still fresh
            connection.idle_since = pool.until = 0.0  # long idle, its pin long expired
            poster._tidy()
            assert poster._pools == {} and connection.closed

    run(test)


def test_a_request_waiting_for_its_host_to_resolve_when_the_sender_closes_fails_plainly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def test(sender: WebhookSender) -> None:
        poster = poster_of(sender)

        async def slow(*_: object) -> object:
            await asyncio.sleep(5)
            raise AssertionError("not reached")

        monkeypatch.setattr(poster._resolver, "resolve", slow)
        pending = asyncio.create_task(
            poster.post("http://localhost:9/h", "localhost", 9, {}, b"{}")
        )
        await wait_until(lambda: bool(poster._pinning))
        await poster.aclose()
        result = await asyncio.wait_for(pending, 0.5)
        assert (result.status, result.failure) == (None, Failure.CONNECTION_ERROR)
        assert "sender was closed" in result.detail

    run(test)
