"""The error answer of the ingestion API, tracking and admin endpoints alike (one envelope:
``pipeline.core.segment_request.error_envelope``)."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from aiohttp import web

from pipeline.core.segment_request import error_envelope

__all__ = ["error_response"]


def error_response(
    status: int,
    code: str,
    message: str,
    field: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    """An error answer of the ingestion API (tracking and admin endpoints alike)."""
    return web.Response(
        body=orjson.dumps(error_envelope(code, message, field)),
        status=status,
        content_type="application/json",
        headers=headers,
    )
