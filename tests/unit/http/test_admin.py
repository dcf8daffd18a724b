"""The admin endpoints' refusals, answered with the tracking API's error envelope; no broker needed
(every case here is refused before Kafka is asked)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from pipeline.core.config import ConfigTable
from pipeline.core.settings import Settings
from pipeline.http.admin import AdminEndpoints

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def answer(
    token: str | None,
    ask: Callable[[TestClient[Any, Any]], Awaitable[Any]],
    table: ConfigTable | None = None,
) -> tuple[int, Any]:
    """Serve the admin endpoints, ``ask`` them once, and return (status, JSON body)."""

    async def main() -> tuple[int, Any]:
        app = web.Application()
        AdminEndpoints(Settings(), token, lambda: table).add_routes(app)
        async with TestClient(TestServer(app)) as client:
            response = await ask(client)
            assert response.content_type == "application/json"
            return response.status, await response.json()

    return asyncio.run(main())


def error(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"success": False, "code": code, "message": message}
    if field is not None:
        body["field"] = field
    return body


def test_without_a_token_the_endpoints_are_off() -> None:
    off = error(
        "admin_disabled", "admin endpoints are off; set PIPELINE_ADMIN_TOKEN to turn them on"
    )
    assert answer(None, lambda c: c.post("/admin/delete-user", json={"userId": "u"})) == (404, off)
    assert answer(None, lambda c: c.get("/admin/delete-user/u", headers=AUTH)) == (404, off)


def test_a_missing_or_wrong_token_is_401_naming_the_header() -> None:
    unauthorized = error(
        "unauthorized", "Authorization: Bearer <PIPELINE_ADMIN_TOKEN> is required", "Authorization"
    )
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": TOKEN}):
        status = answer(
            TOKEN, lambda c, h=headers: c.post("/admin/delete-user", json={}, headers=h)
        )
        assert status == (401, unauthorized), headers
    assert answer(TOKEN, lambda c: c.get("/admin/delete-user/u")) == (401, unauthorized)


def test_bad_bodies_name_the_field() -> None:
    def post(body: bytes) -> Callable[[TestClient[Any, Any]], Awaitable[Any]]:
        return lambda c: c.post("/admin/delete-user", data=body, headers=AUTH)

    status, body = answer(TOKEN, post(b"{"))
    assert status == 400 and body["code"] == "invalid_json" and body["field"] == "body"
    assert body["message"].startswith("body: not JSON: ")
    cases = {
        b'{"userId": 42}': error("invalid_field", "userId: a string is required", "userId"),
        b"[1]": error("invalid_field", "userId: a string is required", "userId"),
        b'{"userId": "u", "reason": 1}': error(
            "invalid_field", "reason: must be a string", "reason"
        ),
        b'{"userId": "u", "force": "yes"}': error(
            "invalid_field", "force: must be true or false", "force"
        ),
    }
    for sent, expected in cases.items():
        assert answer(TOKEN, post(sent)) == (400, expected), sent


def test_before_the_config_is_loaded_a_deletion_is_503() -> None:
    status = answer(
        TOKEN, lambda c: c.post("/admin/delete-user", json={"userId": "u"}, headers=AUTH)
    )
    assert status == (503, error("not_ready", "the config is not loaded yet; retry"))
