"""A webhook request's trace context and span (``pipeline.runtime.tracing``).

The request carries its call's context in ``traceparent`` (and ``tracestate``): when the span is
recorded here, the attempt's own HTTP client span (semantic conventions: ``http.request.method``,
``url.full`` (its origin: no path, query or credentials), ``server.address``, ``server.port``,
``http.response.status_code``, ``error.type``, ``http.request.resend_count``); else the context
as it came (tracing off, or a call whose trace is not sampled). A span never holds a header
value, the body or the query string (where secrets travel)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import lru_cache
from urllib.parse import urlsplit

from pipeline.core.outcomes import UrlResult
from pipeline.runtime import tracing
from pipeline.runtime.lean_spans import Sink, Started

__all__ = ["traced_post", "passed_on"]

Post = Callable[[dict[str, str]], Awaitable[UrlResult]]


@lru_cache(maxsize=1024)
def _url_attributes(url: str) -> dict[str, str | int]:
    """The span attributes of ``url``: its origin only. No path either: a webhook URL often
    carries its secret there (Slack's ``/services/T…/B…/<token>``, Discord's)."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname or ""
    except ValueError:
        return {"url.full": "(invalid)"}
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return {
        "url.full": f"{parts.scheme}://{netloc}",
        "server.address": host,
        "server.port": port,
    }


def passed_on(headers: dict[str, str], trace: tracing.TraceHeaders) -> dict[str, str]:
    """``headers`` and the trace context ``trace`` as it came, for a request whose span is not
    recorded here (the sender calls this, not ``traced_post``, then: no coroutine, span or
    attributes for a context that only passes through). Cleaned again: a record on
    ``deliveries`` someone else produced must not fail the request."""
    passed = headers.copy()
    for name, value in tracing.cleaned(trace):
        passed[name] = value.decode("latin-1")
    return passed


def traced_post(
    post: Post,
    url: str,
    headers: dict[str, str],
    trace: tracing.TraceHeaders,
    resends: int,
    destination: str,
    message_id: str,
    sent: bool = True,
) -> Awaitable[UrlResult]:
    """``post(headers)`` with the trace context ``trace``: the attempt of ``message_id`` to
    ``destination``; ``sent``: in the request's headers (a destination's ``trace_context``).
    What to await: the request itself when no span is made here (no coroutine around it)."""
    lean = tracing.lean()
    if lean is not None:
        begun = tracing.begun(trace)
        if begun is None:
            return post(passed_on(headers, trace) if sent else headers)
        return _lean_post(lean, begun, post, url, headers, resends, destination, message_id, sent)
    span = None
    if trace and tracing.recording(trace):
        span = tracing.child_span(
            "POST",
            trace,
            tracing.SpanKind.CLIENT,
            {**_shared((url, destination)), "pipeline.message_id": message_id},
        )
    if span is None:
        return post(passed_on(headers, trace) if sent else headers)
    return _sdk_post(span, post, headers, resends, sent)


async def _sdk_post(
    span: tracing.AnySpan,
    post: Post,
    headers: dict[str, str],
    resends: int,
    sent: bool,
) -> UrlResult:
    """``traced_post`` with the SDK's span (or a ``LeanSpan``), begun."""
    if resends:
        span.set_attribute("http.request.resend_count", resends)
    if sent:
        headers = {**headers, **{name: value.decode() for name, value in tracing.headers_of(span)}}
    try:
        result = await post(headers)
    except BaseException as exc:
        span.set_attribute("error.type", type(exc).__qualname__)
        span.set_status(tracing.StatusCode.ERROR)
        span.end()
        raise
    if result.status is not None:
        span.set_attribute("http.response.status_code", result.status)
    if not result.ok:
        span.set_attribute("error.type", _error_type(result))
        span.set_status(tracing.StatusCode.ERROR)
    span.end()
    return result


async def _lean_post(
    lean: Sink,
    begun: Started,
    post: Post,
    url: str,
    headers: dict[str, str],
    resends: int,
    destination: str,
    message_id: str,
    sent: bool,
) -> UrlResult:
    """``traced_post`` with a lean span: no span object, its URL's and destination's attributes
    encoded once (what the SDK's span of the same content would send)."""
    if sent:
        headers = {**headers, tracing.TRACEPARENT: begun.traceparent.decode()}
        if begun.trace_state:
            headers[tracing.TRACESTATE] = begun.trace_state
    own: dict[str, str | int] = {"pipeline.message_id": message_id}
    if resends:
        own["http.request.resend_count"] = resends
    shared = lean.block((url, destination), _shared)
    try:
        result = await post(headers)
    except BaseException as exc:
        own["error.type"] = type(exc).__qualname__
        lean.ended("POST", _CLIENT, begun, own, shared, True)
        raise
    if result.status is not None:
        own["http.response.status_code"] = result.status
    failed = not result.ok
    if failed:
        own["error.type"] = _error_type(result)
    lean.ended("POST", _CLIENT, begun, own, shared, failed)
    return result


_CLIENT = tracing.SpanKind.CLIENT


def _shared(key: tuple[str, str]) -> dict[str, str | int]:
    """The attributes of every attempt to a URL for a destination (``key``: the two)."""
    url, destination = key
    return {
        "http.request.method": "POST",
        **_url_attributes(url),
        "pipeline.destination": destination,
    }


def _error_type(result: UrlResult) -> str:
    """A failed answer's ``error.type``: its status, or what failed."""
    return str(result.status) if result.status is not None else str(result.failure)
