"""An egress proxy (a destination's ``proxy``, ``PIPELINE_HTTP_PROXY``): a real forward proxy on
127.0.0.1 in front of real receivers, the SSRF guard judging the final target."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.support import (
    ServerThread,
    apply,
    dead_letters,
    send_calls,
    serve,
    simple_config,
    stays,
    wait_for,
)


class ForwardProxy:
    """A plain HTTP forward proxy: it takes absolute-form requests, sends them on (a host in
    ``aliases`` to the address given), and remembers each URL it was asked for."""

    def __init__(self, server: ServerThread, aliases: dict[str, str] | None = None) -> None:
        self.seen: list[str] = []
        self._aliases = aliases or {}

        async def forward(request: web.Request) -> web.Response:
            self.seen.append(str(request.url))
            url = request.url
            if url.host in self._aliases:
                url = url.with_host(self._aliases[url.host].split(":")[0]).with_port(
                    int(self._aliases[url.host].split(":")[1])
                )
            headers = {
                k: v
                for k, v in request.headers.items()
                if k.lower() not in ("host", "proxy-connection")
            }
            async with aiohttp.ClientSession() as session:
                async with session.request(
                    request.method, str(url), data=await request.read(), headers=headers
                ) as answer:
                    return web.Response(status=answer.status, body=await answer.read())

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        self.url = f"http://127.0.0.1:{serve(server, app)}"


@pytest.fixture
def server() -> Iterator[ServerThread]:
    thread = ServerThread()
    yield thread
    thread.close()


def calls(count: int) -> list[dict[str, Any]]:
    return [{"type": "track", "event": "Proxied", "userId": f"u{n}"} for n in range(count)]


def test_a_destinations_proxy_carries_every_request(
    settings, server, receiver_factory, worker_factory
):
    receiver = receiver_factory()
    proxy = ForwardProxy(server)
    apply(settings, simple_config(receiver.url, proxy=proxy.url))
    worker_factory(settings)
    send_calls(settings, calls(3), "wk")

    wait_for(lambda: receiver.count() == 3)
    assert proxy.seen == [receiver.url] * 3  # every request went through it


def test_behind_the_global_proxy_the_guard_still_judges_the_final_target(
    settings, server, receiver_factory, worker_factory
):
    """``PIPELINE_HTTP_PROXY`` on 127.0.0.1 and the SSRF guard's defaults (loopback blocked):
    the proxy itself is reached (an operator's setting), a webhook on a loopback address is
    refused without a request (``blocked_address``), and one whose host only the proxy can
    resolve goes through it."""
    receiver = receiver_factory()
    port = receiver.url.split(":")[2].split("/")[0]
    proxy = ForwardProxy(server, aliases={"receiver.invalid": f"127.0.0.1:{port}"})
    guarded = settings.replace(http_proxy=proxy.url, allowed_networks=())
    config = simple_config(receiver.url.replace("127.0.0.1", "localhost"))
    reached = {
        **config["destinations"][0],
        "id": "reached",
        "webhooks": [{"url": f"http://receiver.invalid:{port}/hook"}],
    }
    config["destinations"].append(reached)
    apply(guarded, config)
    worker_factory(guarded)
    send_calls(guarded, calls(1), "wk")

    [letter] = dead_letters(guarded, 1)
    assert letter["reason"] == "blocked_address"
    assert letter["delivery"]["destinationId"] == "hooks"
    wait_for(lambda: receiver.count() == 1)
    assert proxy.seen == [f"http://receiver.invalid:{port}/hook"]  # never the blocked one
    assert stays(lambda: receiver.count() == 1 and len(proxy.seen) == 1, 1.0)
