"""Section 16's figures measured alone: the tracing code's own work a call, in this process,
without Kafka, HTTP or the rest of a worker around it (best of several passes of 20,000 calls).

End to end, runs of the same worker on this machine spread ±15 %, far more than the cost of
tracing off or at 1 %; measured alone that cost is a few microseconds. A tight loop keeps its
caches hot: inside a busy worker the same code takes about three times as long (py-spy), so these
figures rank the situations rather than predict a worker's rate. The situations rotate within
each pass, so the machine's drift reaches them all alike. Each situation runs what a worker runs
for a call: the router's part (the call's trace headers, cleaned, its trace id for the log, its
routing step, what it passes on) and the deliver role's (the record's trace headers, the
request's span or its context passed on, around a request that costs nothing). At 100 % each
call's two spans are made, encoded and queued; the exporter's request (about 0.8 ms of CPU per
2,048 spans, on its own thread) is not counted.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from pipeline.core.outcomes import UrlResult
from pipeline.http.request_tracing import passed_on, traced_post
from pipeline.runtime import lean_spans, tracing

__all__ = ["work_alone"]

URL = "http://127.0.0.1:8080/hook"
ROUTED = {
    "pipeline.call.type": "track",
    "pipeline.message_id": "m-1",
    "pipeline.source": "s",
    "pipeline.destinations": ["d1"],
}


class _Message:
    def __init__(self, headers: list[tuple[str, bytes]] | None) -> None:
        self._headers = headers

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers


class _Queued:
    """Stands in for the batch processor: keeps the encoded spans."""

    def __init__(self) -> None:
        self.spans: list[Any] = []

    def on_end(self, span: Any) -> None:
        self.spans.append(span)


_ANSWER = UrlResult(URL, 200)


async def _post(headers: dict[str, str]) -> UrlResult:
    return _ANSWER


async def _per_call(messages: list[_Message], passes: int) -> float:
    """The best pass's µs a call for the router's and the deliver role's tracing work."""
    best = float("inf")
    headers = {"Content-Type": "application/json", "X-Signature": "0" * 64}
    for _ in range(passes):
        started = time.process_time()
        for message in messages:
            trace = tracing.trace_headers(message.headers())  # the router
            trace = tracing.cleaned(trace) if trace else trace
            _ = tracing.cleaned_trace_id(trace)
            if trace and tracing.recording(trace):
                trace = tracing.step(trace, "route track", ROUTED)
            else:
                trace = tracing.passed_on(trace)  # what its delivery records carry
            sent = tracing.trace_headers(trace)  # the deliver role: the record's headers
            if sent and tracing.recording(sent):  # as ``WebhookSender.attempt`` decides
                await traced_post(_post, URL, headers, sent, 0, "d1", "m-1")
            else:
                await _post(passed_on(headers, sent) if sent else headers)
        best = min(best, (time.process_time() - started) / len(messages) * 1e6)
    return best


def work_alone(calls: int = 20_000, passes: int = 7) -> dict[str, float]:
    """µs a call of tracing work, by situation: ``none`` (no context, tracing off), ``off`` (a
    context, tracing off), ``1 %`` (tracing on, an unsampled context), ``100 %`` (a sampled
    one)."""

    def contexts(flags: str) -> list[_Message]:
        return [
            _Message(
                [("traceparent", f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-{flags}".encode())]
            )
            for _ in range(calls)
        ]

    async def measure() -> dict[str, float]:
        sampled, unsampled = contexts("01"), contexts("00")
        plain = [_Message(None)] * calls
        on = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
        situations = {
            "none": ({}, plain, False),
            "off": ({}, sampled, False),
            "1 %": (on, unsampled, False),
            "100 %": (on, sampled, True),
        }
        figures = {name: float("inf") for name in situations}
        for _ in range(passes):
            for name, (environ, messages, queue) in situations.items():
                tracing.configure("bench", environ)
                if queue:  # spans made and encoded, kept instead of exported
                    encoder = lean_spans.Encoder(
                        {"service.name": "b"}, "pipeline", lean_spans.Limits()
                    )
                    tracing._state.lean = lean_spans.Sink(_Queued(), encoder)
                figures[name] = min(figures[name], await _per_call(messages, 1))
        tracing.configure("bench", {})
        return figures

    return asyncio.run(measure())
