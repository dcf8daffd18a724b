"""The trace context a webhook request carries when its span is not recorded here (tracing off):
the call's as it came, cleaned, unless the destination says ``trace_context: false``. The
requests go to a real HTTP server on 127.0.0.1, through both HTTP clients."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web

from pipeline.core.config import Destination
from pipeline.core.settings import Settings
from pipeline.runtime import tracing
from tests.unit.http._receiving import sender_and_server

TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def received(trace: tracing.TraceHeaders, client: str, **fields: Any) -> list[dict[str, str]]:
    """The headers a server on 127.0.0.1 got for two attempts of a call with ``trace``, to a
    destination with ``fields``."""
    got: list[dict[str, str]] = []

    async def handle(request: web.Request) -> web.Response:
        got.append({name.lower(): value for name, value in request.headers.items()})
        return web.Response(status=200)

    async def go() -> None:
        settings = Settings(allowed_networks=("127.0.0.0/8",), http_client=client)
        async with sender_and_server(handle, settings) as (sender, port):
            hook = {"url": f"http://127.0.0.1:{port}/hook", "headers": {"X-Static": "s"}}
            destination = Destination(id="d", sources=["web"], webhooks=[hook], **fields)
            for _ in range(2):
                [result] = await sender.attempt(destination, b"{}", "m1", trace=trace)
                assert result.status == 200

    assert not tracing.enabled()
    asyncio.run(go())
    return got


@pytest.mark.parametrize("client", ["reqwest", "aiohttp"])
def test_the_calls_context_goes_on_as_it_came(client: str) -> None:
    state = b"vendor=opaque"
    trace = [(tracing.TRACEPARENT, TRACEPARENT), (tracing.TRACESTATE, state)]
    for headers in received(trace, client):
        assert headers["traceparent"] == TRACEPARENT.decode()
        assert headers["tracestate"] == state.decode()
        assert headers["x-static"] == "s" and headers["content-type"] == "application/json"


@pytest.mark.parametrize("client", ["reqwest", "aiohttp"])
def test_a_destination_without_trace_context_gets_none(client: str) -> None:
    for headers in received([(tracing.TRACEPARENT, TRACEPARENT)], client, trace_context=False):
        assert "traceparent" not in headers and "tracestate" not in headers
        assert headers["x-static"] == "s"


def test_a_context_not_of_the_w3c_form_is_not_passed_on() -> None:
    """A record on ``deliveries`` someone else produced: the request goes, without it."""
    trace = [(tracing.TRACEPARENT, b"00-not-a-trace-01"), (tracing.TRACESTATE, b"a=b")]
    for headers in received(trace, "reqwest"):
        assert "traceparent" not in headers and "tracestate" not in headers


def test_a_call_without_a_context_carries_none() -> None:
    for headers in received([], "reqwest"):
        assert "traceparent" not in headers
