"""``read_body``: the body read as a stream with a cap, gzip inflated with an output limit; served
by a real aiohttp server on 127.0.0.1, no broker."""

from __future__ import annotations

import asyncio
import gzip
from typing import Any

import httpx
from aiohttp import web
from aiohttp.test_utils import TestServer

from pipeline.core.segment_request import RequestRefused
from pipeline.http.ingest import SERVER_ARGS, read_body

LIMIT = 1000


async def _echo(request: web.Request) -> web.Response:
    try:
        body = await read_body(request, LIMIT, chunk=64)
    except RequestRefused as refused:
        return web.json_response(refused.envelope(), status=refused.status)
    return web.Response(body=body)


def post(body: bytes, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async def main() -> tuple[int, Any]:
        app = web.Application()
        app.router.add_post("/", _echo)
        # httpx, not aiohttp's client: that one compresses a body sent with Content-Encoding.
        server = TestServer(app)
        await server.start_server(**SERVER_ARGS)  # TestServer(...) would drop SERVER_ARGS
        async with server, httpx.AsyncClient() as http:
            response = await http.post(str(server.make_url("/")), content=body, headers=headers)
            if response.status_code == 200:
                return 200, response.content
            assert response.headers["Content-Type"].startswith("application/json")
            return response.status_code, response.json()

    return asyncio.run(main())


GZIP = {"Content-Encoding": "gzip"}


def test_plain_and_gzip_bodies_up_to_the_limit() -> None:
    assert post(b"x" * LIMIT) == (200, b"x" * LIMIT)
    assert post(gzip.compress(b"y" * LIMIT), GZIP) == (200, b"y" * LIMIT)
    assert post(gzip.compress(b"z"), {"Content-Encoding": "X-Gzip"}) == (200, b"z")
    assert post(b"", GZIP) == (200, b"")


def test_over_the_limit_is_413_before_or_after_inflating() -> None:
    status, body = post(b"x" * (LIMIT + 1))
    assert (status, body["code"], body["field"]) == (413, "too_large", "body")
    assert body["message"] == "body: is over the limit of 1,000 bytes a request"
    status, body = post(gzip.compress(b" " * 1_000_000), GZIP)  # a small bomb: ~1 KB gzipped
    assert status == 413
    assert body["message"].endswith("(counted after decompression)")


def test_broken_gzip_and_unknown_encodings() -> None:
    status, body = post(gzip.compress(b"{}")[:-4], GZIP)
    assert (status, body["code"], body["message"]) == (
        400,
        "invalid_gzip",
        "body: the gzip stream is truncated",
    )
    status, body = post(gzip.compress(b"{}") * 2, GZIP)
    assert (status, body["message"]) == (
        400,
        "body: data after the end of the gzip stream (one gzip member only)",
    )
    status, body = post(b"{}", GZIP)
    assert (status, body["code"]) == (400, "invalid_gzip")
    status, body = post(b"{}", {"Content-Encoding": "br"})
    assert (status, body["code"], body["field"]) == (
        415,
        "unsupported_encoding",
        "Content-Encoding",
    )
