"""A started ``WebhookSender`` beside a real aiohttp server on 127.0.0.1, for the sender's tests."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web

from pipeline.core.settings import Settings
from pipeline.http.sender import WebhookSender

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def sender_and_server(
    handle: Handler, settings: Settings, tls: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[WebhookSender, int]]:
    """A sender started with ``settings``, and the port of a server where ``handle`` answers
    every POST (over TLS with ``tls``); both closed at the end."""
    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    sender = await WebhookSender(settings).start()
    try:
        yield sender, port
    finally:
        await sender.aclose()
        await runner.cleanup()
