"""``PIPELINE_HTTP_CLIENT=httptools`` and ``reqwest``: the sender's requests through either mean
what they mean through aiohttp (status, failure, snippet, ``Retry-After``), the SSRF guard holds
for host names (pinned to the address judged) and IP literals, redirects are not followed, and a
destination with its own TLS settings or proxy stays on aiohttp; pyreqwest's runtime threads.
Real servers on 127.0.0.1 (``test_h1_post`` has the httptools client's own)."""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trustme
from aiohttp import web

from pipeline.core.config import Destination
from pipeline.core.outcomes import Failure, UrlResult
from pipeline.core.settings import Settings
from pipeline.http import reqwest_post
from pipeline.http.sender import WebhookSender
from pipeline.runtime.net import free_port
from tests.support import ROOT
from tests.unit.http._receiving import sender_and_server

LOOPBACK = Settings(http_client="reqwest", allowed_networks=("127.0.0.0/8",), delivery_timeout=1.0)


@pytest.fixture(params=["httptools", "reqwest"])
def loopback(request: pytest.FixtureRequest) -> Settings:
    """Settings of a sender on either client that may reach 127.0.0.1."""
    return LOOPBACK.model_copy(update={"http_client": request.param})


def destination(url: str, **fields: object) -> Destination:
    return Destination(id="d", sources=["web"], webhooks=[{"url": url}], **fields)


Test = Callable[[WebhookSender, str, list[web.Request]], Awaitable[None]]


def with_server(
    test: Test, settings: Settings = LOOPBACK, tls: ssl.SSLContext | None = None
) -> None:
    """Run ``test`` with a started sender and a server on 127.0.0.1 (its base URL; the requests
    it got): ``/ok`` 200, ``/fail`` 500 with a body, ``/slow`` 429 with ``Retry-After: 7``,
    ``/moved`` 302 to ``/ok``, ``/hang`` past the timeout."""
    seen: list[web.Request] = []

    async def handle(request: web.Request) -> web.Response:
        await request.read()
        seen.append(request)
        if request.path == "/fail":
            return web.Response(status=500, text="database is down " + "x" * 5000)
        if request.path == "/slow":
            return web.Response(status=429, headers={"Retry-After": "7"})
        if request.path == "/moved":
            return web.Response(status=302, headers={"Location": "/ok"})
        if request.path == "/hang":
            await asyncio.sleep(3)
        return web.Response(status=200, text="ok")

    async def go() -> None:
        async with sender_and_server(handle, settings, tls) as (sender, port):
            assert sender._poster is not None
            await test(sender, f"{'https' if tls else 'http'}://127.0.0.1:{port}", seen)

    asyncio.run(go())


async def post(sender: WebhookSender, url: str, **fields: object) -> UrlResult:
    [result] = await sender.attempt(destination(url, **fields), b'{"a":1}', "m1")
    return result


def test_answers_mean_what_they_mean_through_aiohttp(loopback: Settings) -> None:
    async def test(sender: WebhookSender, base: str, seen: list[web.Request]) -> None:
        ok = await post(sender, f"{base}/ok")
        assert (ok.status, ok.failure) == (200, None)
        assert seen[0].headers["Content-Type"] == "application/json"
        assert seen[0].headers["User-Agent"].startswith("pipeline")
        failed = await post(sender, f"{base}/fail")
        assert (failed.status, failed.failure) == (500, Failure.SERVER_ERROR)
        assert failed.detail.startswith("database is down") and len(failed.detail) == 200
        assert len(failed.response) == 1024  # the log's snippet
        slow = await post(sender, f"{base}/slow")
        assert (slow.status, slow.failure, slow.retry_after) == (429, Failure.RATE_LIMITED, 7.0)
        moved = await post(sender, f"{base}/moved")
        assert (moved.status, moved.failure) == (302, Failure.REDIRECT)
        assert [r.path for r in seen] == ["/ok", "/fail", "/slow", "/moved"]  # not followed
        hung = await post(sender, f"{base}/hang")
        assert (hung.status, hung.failure) == (None, Failure.TIMEOUT)
        assert hung.detail == "no answer within 1 s" and hung.duration < 2.5

    with_server(test, loopback)


def test_a_refused_connection_and_an_answer_that_is_not_http(loopback: Settings) -> None:
    async def test(sender: WebhookSender, _base: str, _seen: list[web.Request]) -> None:
        refused = await post(sender, f"http://127.0.0.1:{free_port()}/hook")
        assert (refused.status, refused.failure) == (None, Failure.CONNECTION_ERROR)
        assert "refused" in refused.detail.lower()

        async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(1024)
            writer.write(b"\x00\x01 this is not HTTP\r\n\r\n")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(garbage, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            bad = await post(sender, f"http://127.0.0.1:{port}/hook")
        finally:
            server.close()
        assert bad.status is None
        assert bad.failure is Failure.BAD_RESPONSE

    with_server(test, loopback)


def test_a_self_signed_receiver_is_a_tls_error_and_gets_no_request(loopback: Settings) -> None:
    authority = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(context)

    async def test(sender: WebhookSender, base: str, seen: list[web.Request]) -> None:
        assert base.startswith("https://")
        result = await post(sender, f"{base}/ok")
        assert (result.status, result.failure) == (None, Failure.TLS_ERROR)
        assert "certificate" in result.detail.lower()
        assert seen == []

    with_server(test, loopback, tls=context)


def test_a_host_name_is_judged_and_pinned_to_the_address_judged(loopback: Settings) -> None:
    async def test(sender: WebhookSender, base: str, seen: list[web.Request]) -> None:
        named = base.replace("127.0.0.1", "localhost")
        result = await post(sender, f"{named}/ok")
        assert (result.status, result.failure) == (200, None)
        assert seen[0].headers["Host"] == named.removeprefix("http://")
        assert seen[0].transport is not None
        assert seen[0].transport.get_extra_info("peername")[0] == "127.0.0.1"

    with_server(test, loopback)


def test_the_ssrf_guard_refuses_a_blocked_host_name_and_ip_literal(loopback: Settings) -> None:
    guarded = loopback.model_copy(update={"allowed_networks": ()})  # loopback not allowed

    async def test(sender: WebhookSender, base: str, seen: list[web.Request]) -> None:
        by_name = await post(sender, base.replace("127.0.0.1", "localhost") + "/ok")
        assert (by_name.status, by_name.failure) == (None, Failure.BLOCKED_ADDRESS)
        assert "loopback" in by_name.detail
        literal = await post(sender, f"{base}/ok")
        assert (literal.status, literal.failure) == (None, Failure.BLOCKED_ADDRESS)
        assert seen == []

    with_server(test, guarded)


def test_a_destination_with_its_own_proxy_stays_on_aiohttp(loopback: Settings) -> None:
    """Neither would go through it the guarded way: the request goes to the proxy,
    as aiohttp sends it (a refusing proxy's answer, in aiohttp's words)."""

    async def test(sender: WebhookSender, base: str, seen: list[web.Request]) -> None:
        proxy = socket.socket()
        proxy.bind(("127.0.0.1", 0))
        proxy.listen()
        proxy_port = proxy.getsockname()[1]
        proxy.close()  # nothing listens there: the proxy cannot be reached
        result = await post(sender, f"{base}/ok", proxy=f"http://127.0.0.1:{proxy_port}")
        assert (result.status, result.failure) == (None, Failure.CONNECTION_ERROR)
        assert "ClientProxyConnectionError" in result.detail
        assert seen == []

    with_server(test, loopback)


def test_a_host_is_pinned_once_and_keeps_its_client_while_its_address_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Many first requests to a host wait for one client; once its pin expires the host is
    judged again, and the same address keeps the same client (and its connections)."""

    async def test(sender: WebhookSender, base: str, seen: list[web.Request]) -> None:
        named = base.replace("127.0.0.1", "localhost") + "/ok"
        poster = sender._poster
        assert poster is not None
        built: list[str] = []
        build = poster._client

        async def counted(host: str = "", address: str = "", port: int = 0) -> Any:
            built.append(host)
            return await build(host, address, port)

        monkeypatch.setattr(poster, "_client", counted)
        results = await asyncio.gather(*(post(sender, named) for _ in range(20)))
        assert [r.status for r in results] == [200] * 20
        assert built == ["localhost"]
        first = poster._pins["localhost"]
        monkeypatch.setattr(reqwest_post, "PIN_SECONDS", 0.0)
        first.until = 0.0  # expired: judged again on the next request
        assert (await post(sender, named)).status == 200
        assert poster._pins["localhost"].client is first.client
        assert built == ["localhost"] and len(seen) == 21

    with_server(test)


#: Started in a fresh process (the runtime is one a process): senders with each given
#: ``PIPELINE_HTTP_THREADS`` in turn, 20 requests each to a server on 127.0.0.1; prints the
#: answers that were 200 and the runtime's worker threads.
_RUNTIME_SCRIPT = """
import asyncio, os, sys
from aiohttp import web
from pipeline.core.config import Destination
from pipeline.core.settings import Settings
from tests.unit.http._receiving import sender_and_server

async def handle(request):
    await request.read()
    return web.Response(text="ok")

async def main():
    ok = 0
    for threads in sys.argv[1:]:
        settings = Settings(
            http_client="reqwest", allowed_networks=("127.0.0.0/8",), http_threads=int(threads)
        )
        async with sender_and_server(handle, settings) as (sender, port):
            hooks = Destination(
                id="d", sources=["web"], webhooks=[{"url": f"http://127.0.0.1:{port}/h"}]
            )
            for results in await asyncio.gather(*(sender.attempt(hooks, b"{}") for _ in range(20))):
                ok += results[0].status == 200
    tasks = os.listdir("/proc/self/task")
    names = [open(f"/proc/self/task/{task}/comm").read() for task in tasks]
    print(ok, sum(name.startswith("pyreqwest-work") for name in names))

asyncio.run(main())
"""


def _runtime_run(*threads: int) -> tuple[list[int], str]:
    done = subprocess.run(
        [sys.executable, "-c", _RUNTIME_SCRIPT, *map(str, threads)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return [int(word) for word in done.stdout.split()], done.stderr


def test_requests_run_on_a_runtime_of_the_threads_asked_for() -> None:
    """``PIPELINE_HTTP_THREADS=3``: every request answered, on tokio's multi-threaded runtime
    with 3 worker threads; 1: on pyreqwest's single-threaded runtime (no worker threads)."""
    assert _runtime_run(3)[0] == [20, 3]
    assert _runtime_run(1)[0] == [20, 0]


def test_a_second_sender_asking_for_other_threads_is_told_the_runtime_keeps_its_own() -> None:
    """The runtime started with 2 threads keeps them; a sender asking for 3 later still sends,
    and the log says so."""
    (answered_ok, workers), stderr = _runtime_run(2, 3)
    assert (answered_ok, workers) == (40, 2)
    assert "keeps its threads, not 3" in stderr
