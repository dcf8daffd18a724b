"""The W3C trace context of the application's active OpenTelemetry span, taken when a call is
made: it travels with the call (Kafka transport: on its record; HTTP: on a request whose calls
share it), so the call's trace in the pipeline is a child of the span that made it.

Read only when the application has imported OpenTelemetry (``opentelemetry.trace`` loaded); the
client itself never imports it for nothing."""

from __future__ import annotations

import sys

__all__ = ["TraceContext", "current_trace"]

#: (name, value) pairs: ``traceparent`` and, if any, ``tracestate``.
TraceContext = tuple[tuple[str, bytes], ...]


def current_trace() -> TraceContext:
    """The active span's context, or ``()`` when there is none (or no OpenTelemetry)."""
    if "opentelemetry.trace" not in sys.modules:
        return ()
    from opentelemetry.trace import get_current_span
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not get_current_span().get_span_context().is_valid:
        return ()
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return tuple((name, value.encode()) for name, value in sorted(carrier.items()))
