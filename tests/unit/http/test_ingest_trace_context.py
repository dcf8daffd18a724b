"""The trace context an ingestion request passes on with tracing off: only a valid one, and a
hostile header never fails the request."""

from __future__ import annotations

from multidict import CIMultiDict

from pipeline.http.ingest import _passed_on

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_valid_context_is_passed_on_as_it_came() -> None:
    headers = CIMultiDict({"Traceparent": TRACEPARENT, "tracestate": "v=1"})
    assert _passed_on(headers) == [("traceparent", TRACEPARENT.encode()), ("tracestate", b"v=1")]


def test_undecodable_or_malformed_headers_are_dropped_not_raised() -> None:
    # aiohttp hands undecodable header bytes over as surrogates ("surrogateescape")
    obs_text = b"a=\xff".decode("utf-8", "surrogateescape")
    assert _passed_on(CIMultiDict({"traceparent": TRACEPARENT, "tracestate": obs_text})) == [
        ("traceparent", TRACEPARENT.encode())
    ]
    future = f"01-{TRACEPARENT[3:]}-" + b"\xff".decode("utf-8", "surrogateescape")
    assert _passed_on(CIMultiDict({"traceparent": future})) == []
    assert _passed_on(CIMultiDict({"traceparent": "00-nonsense"})) == []
    assert _passed_on(CIMultiDict()) == []
