"""The ingestion API's admin endpoints: deletion requests (seed §1.6).

    POST /admin/delete-user            {"userId", "reason"?, "force"?}: a deletion request
    GET  /admin/delete-user/{user_id}  the recorded requests and what they sent

Off unless a token is set (``PIPELINE_ADMIN_TOKEN``); then every request needs
``Authorization: Bearer <token>``. Errors are answered with the tracking API's envelope
(``error_envelope``): ``{"success": false, "code": ..., "message": ..., "field": ...}``, the
``field`` present when one field is to blame.
"""

from __future__ import annotations

import asyncio
import enum
import hmac
from collections.abc import Callable

import orjson
from aiohttp import web

from pipeline.core.config import ConfigTable
from pipeline.core.exceptions import BrokerUnavailable, InvalidCall
from pipeline.core.records import deletion_request_to_record
from pipeline.core.settings import Settings
from pipeline.http.errors import error_response
from pipeline.ops.deletion import read_request, request_deletion

__all__ = ["AdminCode", "AdminEndpoints"]


class AdminCode(enum.StrEnum):
    """The ``code`` of an admin endpoint's error answer."""

    ADMIN_DISABLED = "admin_disabled"
    """404: no admin token is set, so the admin endpoints are off."""
    UNAUTHORIZED = "unauthorized"
    """401: no ``Authorization: Bearer`` header, or not the admin token."""
    INVALID_JSON = "invalid_json"
    """400: the body is not JSON."""
    INVALID_FIELD = "invalid_field"
    """400: a field is missing or breaks a rule; ``field`` names it."""
    NOT_FOUND = "not_found"
    """404: no deletion request was ever made for this user."""
    NOT_READY = "not_ready"
    """503: the config is not loaded yet; retry."""
    KAFKA_UNAVAILABLE = "kafka_unavailable"
    """503: Kafka did not answer in time; retry."""


def _invalid(exc: InvalidCall) -> web.Response:
    return error_response(400, AdminCode.INVALID_FIELD, str(exc), exc.field)


def _unavailable(exc: BrokerUnavailable) -> web.Response:
    return error_response(503, AdminCode.KAFKA_UNAVAILABLE, str(exc))


class AdminEndpoints:
    """The admin handlers. ``table`` gives the followed config, or None before it is loaded."""

    def __init__(
        self, settings: Settings, token: str | None, table: Callable[[], ConfigTable | None]
    ) -> None:
        self.settings = settings
        self.token = token
        self.table = table

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/admin/delete-user", self.delete_user)
        app.router.add_get("/admin/delete-user/{user_id}", self.deletion_status)

    def _refusal(self, request: web.Request) -> web.Response | None:
        if self.token is None:
            return error_response(
                404,
                AdminCode.ADMIN_DISABLED,
                "admin endpoints are off; set PIPELINE_ADMIN_TOKEN to turn them on",
            )
        given = request.headers.get("Authorization", "")
        expected = f"Bearer {self.token}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            return error_response(
                401,
                AdminCode.UNAUTHORIZED,
                "Authorization: Bearer <PIPELINE_ADMIN_TOKEN> is required",
                "Authorization",
            )
        return None

    async def delete_user(self, request: web.Request) -> web.Response:
        """``POST /admin/delete-user {"userId", "reason"?, "force"?}``: a deletion request."""
        refused = self._refusal(request)
        if refused is not None:
            return refused
        try:
            payload = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return error_response(400, AdminCode.INVALID_JSON, f"body: not JSON: {exc}", "body")
        if not isinstance(payload, dict) or not isinstance(payload.get("userId"), str):
            return _invalid(InvalidCall("userId", "a string is required"))
        reason, force = payload.get("reason"), payload.get("force", False)
        if reason is not None and not isinstance(reason, str):
            return _invalid(InvalidCall("reason", "must be a string"))
        if not isinstance(force, bool):
            return _invalid(InvalidCall("force", "must be true or false"))
        table = self.table()
        if table is None:
            return error_response(503, AdminCode.NOT_READY, "the config is not loaded yet; retry")
        try:
            outcome = await asyncio.to_thread(
                request_deletion,
                self.settings,
                payload["userId"],
                reason=reason,
                force=force,
                table=table,
            )
        except InvalidCall as exc:
            return _invalid(exc)
        except BrokerUnavailable as exc:
            return _unavailable(exc)
        return web.json_response(
            {
                "success": not outcome.failed,
                "userId": outcome.user_id,
                "notified": outcome.notified,
                "alreadyNotified": sorted(outcome.already),
                "unaffected": outcome.unaffected,
                "failed": outcome.failed,
            },
            status=200 if not outcome.failed else 503,
        )

    async def deletion_status(self, request: web.Request) -> web.Response:
        """``GET /admin/delete-user/{user_id}``: the recorded requests and what they sent."""
        refused = self._refusal(request)
        if refused is not None:
            return refused
        try:
            record = await asyncio.to_thread(
                read_request, self.settings, request.match_info["user_id"]
            )
        except InvalidCall as exc:
            return _invalid(exc)
        except BrokerUnavailable as exc:
            return _unavailable(exc)
        if record is None:
            return error_response(404, AdminCode.NOT_FOUND, "no deletion request for this user")
        # The schema's camelCase record: the API answers what the record holds, as it always has.
        return web.json_response({"success": True, **deletion_request_to_record(record)})
