"""A real OTLP/HTTP trace endpoint on 127.0.0.1 for the tracing tests: it decodes each export
(``ExportTraceServiceRequest``, protobuf) with the OpenTelemetry proto package and keeps every
span it got."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.support import ServerThread, serve

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass
class ExportedSpan:
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: str
    start: int  # epoch ns
    end: int
    attributes: dict[str, Any]
    events: list[str]
    error: bool
    links: list[tuple[str, str]]  # (trace id, span id) of each linked span

    def values(self) -> list[str]:
        """Every attribute value, as text (lists joined)."""
        return [str(v) for v in self.attributes.values()]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


@dataclass
class Collector:
    url: str = ""
    spans: list[ExportedSpan] = field(default_factory=list)
    exports: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of_trace(self, trace_id: str) -> list[ExportedSpan]:
        with self.lock:
            return sorted((s for s in self.spans if s.trace_id == trace_id), key=lambda s: s.start)

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        ExportedSpan(
                            service=str(resource.get("service.name", "")),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=KINDS.get(span.kind, str(span.kind)),
                            start=span.start_time_unix_nano,
                            end=span.end_time_unix_nano,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            events=[event.name for event in span.events],
                            error=span.status.code == 2,
                            links=[(k.trace_id.hex(), k.span_id.hex()) for k in span.links],
                        )
                    )
        with self.lock:
            self.spans += spans
            self.exports += 1


def start_collector(server: ServerThread) -> Collector:
    """A collector answering ``POST /v1/traces`` on ``server``'s loop."""
    collector = Collector()

    async def export(request: web.Request) -> web.Response:
        collector.add(await request.read())
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    app = web.Application()
    app.router.add_post("/v1/traces", export)
    collector.url = f"http://127.0.0.1:{serve(server, app)}"
    return collector


def tree(spans: list[ExportedSpan]) -> str:
    """The spans as an indented tree with their timings (ms from the first one's start)."""
    if not spans:
        return "(no spans)"
    origin = min(s.start for s in spans)
    by_parent: dict[str, list[ExportedSpan]] = {}
    ids = {s.span_id for s in spans}
    for span in spans:
        by_parent.setdefault(span.parent_id if span.parent_id in ids else "", []).append(span)
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for span in sorted(by_parent.get(parent, []), key=lambda s: s.start):
            at, took = (span.start - origin) / 1e6, (span.end - span.start) / 1e6
            status = span.attributes.get("http.response.status_code", "")
            lines.append(
                f"{'  ' * depth}{span.name} [{span.service}, {span.kind}] +{at:.1f} ms, "
                f"{took:.1f} ms {status}".rstrip()
            )
            walk(span.span_id, depth + 1)

    walk("", 0)
    return "\n".join(lines)
