"""Tracing: a call's journey as OpenTelemetry spans, one trace per call, its W3C trace context
(``traceparent``, ``tracestate``) carried in the Kafka headers of every record that stands for
the call (``calls``, ``deliveries``, the retry tiers, the dead letters, replays) and sent to the
receiver.

**Off unless an exporter is configured**, by the standard variables: ``OTEL_TRACES_EXPORTER``
(``otlp`` or ``console``), or an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` turn it off. The SDK reads the rest itself: the sampler
(``OTEL_TRACES_SAMPLER``, default parent-based always-on), the exporter's headers, timeout and
compression, the batch processor's sizes, the resource (``OTEL_SERVICE_NAME``, default
``pipeline-<role>``). OTLP goes over HTTP (protobuf), port 4318.

**Off, nothing is passed on**: a call's context (from its request or its record on ``calls``)
names its trace in the delivery log, and goes no further: its delivery records and webhook
requests carry none (``passed_on``): carrying it cost a tracing-off worker some 5 % of its CPU
for calls that had one (a header produced, fetched and copied at each hop, and sent), and tracing
off must cost nothing. ``PIPELINE_TRACE_PASS_THROUGH`` passes it on as it came (the sender's
trace reaches the receiver, no span made, nothing parsed).

**On, spans are made only where they are kept**: with a parent-based sampler (the default), a
record whose context is not sampled makes no span at all (its context passes on as it came);
``recording(headers)`` tells. A sampled record's spans are lean ones
(``pipeline.runtime.lean_spans``) when the OTLP exporter is the only one: made and encoded without
the SDK's per-span machinery, which cost half a worker's deliveries at 100 % sampling.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from pipeline.runtime.lean_spans import (
    Encoder,
    LeanSpan,
    Limits,
    Sink,
    Started,
    make_exporter,
    parse_traceparent,
    started,
)

__all__ = [
    "TRACEPARENT",
    "TRACESTATE",
    "TraceHeaders",
    "configure",
    "enabled",
    "passed_on",
    "trace_headers",
    "cleaned",
    "recording",
    "parent_context",
    "start_span",
    "child_span",
    "headers_of",
    "step",
    "Shared",
    "lean",
    "begun",
    "cleaned_trace_id",
    "Span",
    "AnySpan",
    "SpanKind",
    "StatusCode",
]

log = logging.getLogger("pipeline.tracing")

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
#: A record's trace context: its ``traceparent`` and ``tracestate`` headers, as Kafka carries
#: them (empty: it has none).
TraceHeaders = Sequence[tuple[str, bytes]]
#: A span this module makes: the SDK's, or a lean one.
AnySpan = Span | LeanSpan

_PROPAGATOR = TraceContextTextMapPropagator()
_PARENT_BASED = {"parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio"}
_PROTOCOLS = {"http/protobuf"}
#: The instrumentation scope of the pipeline's spans.
_SCOPE = "pipeline"


class _State:
    tracer: Tracer | None = None
    provider: Any = None  # the SDK's TracerProvider, when on
    #: Whether the sampler follows the parent's decision (a record's unsampled context then
    #: makes no span, decided without parsing it).
    parent_based = True
    #: Where lean spans go (``None``: every span is the SDK's).
    lean: Any = None
    #: Whether a context passes on with tracing off (``Settings.trace_pass_through``).
    pass_through = False


_state = _State()


def _wanted(environ: Mapping[str, str]) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "").split(",")}
    exporters.discard("")
    if exporters:
        return bool(exporters - {"none"})
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def configure(
    role: str, environ: Mapping[str, str] | None = None, *, pass_through: bool = False
) -> bool:
    """Set this process's tracing up from the ``OTEL_*`` variables (see the module's docstring);
    ``role`` names the service when ``OTEL_SERVICE_NAME`` does not; ``pass_through``: pass
    contexts on with tracing off. Returns whether it is on. Raises ``ValueError`` naming the
    variable for a setting this build cannot serve."""
    env = os.environ if environ is None else environ
    _state.pass_through = pass_through
    if _state.provider is not None:  # configured again: the last one's spans are sent first
        _state.provider.shutdown()
    _state.provider = _state.tracer = _state.lean = None
    if not _wanted(env):
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")}
    exporters -= {"", "none"}
    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create({} if named else {SERVICE_NAME: f"pipeline-{role}"})
    chosen: list[SpanExporter] = []
    for name in sorted(exporters):
        if name == "otlp":
            for variable in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
                protocol = env.get(variable, "").strip()
                if protocol:
                    if protocol not in _PROTOCOLS:
                        raise ValueError(
                            f"{variable}={protocol}: only http/protobuf is supported (OTLP over "
                            "HTTP, usually port 4318)"
                        )
                    break
            encoder = Encoder(resource.attributes, _SCOPE, Limits())
            chosen.append(make_exporter(encoder))
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            chosen.append(ConsoleSpanExporter())
        else:
            raise ValueError(
                f"OTEL_TRACES_EXPORTER={name}: not an exporter this build has (otlp, console, none)"
            )
    provider = TracerProvider(resource=resource)
    queue, batch = _batch_sizes(env)
    processors = [
        BatchSpanProcessor(exporter, max_queue_size=queue, max_export_batch_size=batch)
        for exporter in chosen
    ]
    for processor in processors:
        provider.add_span_processor(processor)
    sampler = env.get("OTEL_TRACES_SAMPLER", "parentbased_always_on").strip().lower()
    _state.parent_based = sampler in _PARENT_BASED
    _state.provider = provider
    _state.tracer = provider.get_tracer(_SCOPE)
    if _state.parent_based and exporters == {"otlp"}:
        # Lean spans go in bundles to a batch processor of their own, its sizes in bundles.
        queue_spans, batch_spans = _span_counts(env, queue, batch)
        bundle = min(BUNDLE, batch_spans)
        lean = BatchSpanProcessor(
            make_exporter(encoder),
            max_queue_size=max(1, queue_spans // bundle),
            max_export_batch_size=max(1, batch_spans // bundle),
        )
        _state.lean = Sink(lean, encoder, bundle)
        provider.add_span_processor(_state.lean)
    log.info("tracing: on (%s, sampler %s)", ", ".join(sorted(exporters)), sampler)
    return True


#: The batch processor's sizes unless ``OTEL_BSP_MAX_QUEUE_SIZE`` or
#: ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` say otherwise: 2,048 spans a request, not the SDK's 512. A
#: request costs the exporter about 0.7 ms of CPU before its size counts (its HTTP client): 1.4 µs
#: a span at 512 spans a request against 0.4 µs at 2,048 (about 650 KB of protobuf).
BATCH_SIZES = (8192, 2048)


#: Lean spans a bundle (``lean_spans.Sink``).
BUNDLE = 32


def _span_counts(env: Mapping[str, str], queue: int | None, batch: int | None) -> tuple[int, int]:
    """(the queue's size, a request's) in spans: ``queue`` and ``batch``, or the variables', or
    the SDK's defaults where a variable is unset or not a positive number (the SDK's processor,
    made first, has warned of it)."""
    return queue or _positive(env, "OTEL_BSP_MAX_QUEUE_SIZE", 2048), batch or _positive(
        env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512
    )


def _positive(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        value = int(env.get(name) or default)
    except ValueError:
        return default
    return value if value > 0 else default


def _batch_sizes(env: Mapping[str, str]) -> tuple[int | None, int | None]:
    """(the queue's size, a request's), ``None`` where the SDK reads its variable."""
    if env.get("OTEL_BSP_MAX_QUEUE_SIZE") or env.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE"):
        return None, None
    return BATCH_SIZES


def enabled() -> bool:
    """Whether this process makes spans."""
    return _state.tracer is not None


def passed_on(trace: TraceHeaders) -> TraceHeaders:
    """``trace`` where it may go on to the records a call becomes (and so to its receivers):
    tracing is on, or contexts pass through with it off; else none."""
    return trace if _state.tracer is not None or _state.pass_through else []


def trace_headers(headers: Any) -> TraceHeaders:
    """The trace context among a record's ``headers`` (empty: it has none)."""
    if not headers:
        return []
    if len(headers) == 1:  # the common case: a traceparent alone (no comprehension for it)
        first = headers[0]
        if first[0] == TRACEPARENT and first[1].__class__ is bytes:
            return [first]
    return [
        (name, value)
        for name, value in headers
        if (name == TRACEPARENT or name == TRACESTATE) and isinstance(value, bytes)
    ]


#: A ``tracestate`` passed on as it came: printable ASCII, within the W3C length.
_TRACESTATE = re.compile(rb"[\x20-\x7e]{1,512}")


def cleaned(trace: TraceHeaders) -> TraceHeaders:
    """``trace`` as it may be passed on from outside (a request, a record someone else produced):
    a ``traceparent`` of the W3C form, and its ``tracestate`` if printable; anything else is
    dropped (the call goes on without it). What the pipeline carries is always this clean, so
    that it can go into a request header and a parked batch's list as it is."""
    if len(trace) == 1:  # the common case: a traceparent alone
        name, value = trace[0]
        if name == TRACEPARENT and parse_traceparent(value) is not None:
            return trace
        return []
    parent = [value for name, value in trace if name == TRACEPARENT]
    if len(parent) != 1 or parse_traceparent(parent[0]) is None:
        return []
    state = [value for name, value in trace if name == TRACESTATE]
    if len(state) == 1 and _TRACESTATE.fullmatch(state[0]):
        return [(TRACEPARENT, parent[0]), (TRACESTATE, state[0])]
    return [(TRACEPARENT, parent[0])]


def _sampled(traceparent: bytes) -> bool:
    if traceparent[-2:] == b"01":
        return True
    try:
        return bool(int(traceparent[-2:], 16) & 1)
    except ValueError:
        return False


def recording(headers: TraceHeaders) -> bool:
    """Whether a record with this trace context makes spans here: tracing is on, and the sampler
    may keep its spans (a parent-based one keeps only a sampled context's; a record without one
    starts no trace after ingestion)."""
    if _state.tracer is None:
        return False
    for name, value in headers:
        if name == TRACEPARENT:
            return not _state.parent_based or _sampled(value)
    return False


def parent_context(carrier: Mapping[str, str] | TraceHeaders) -> Context | None:
    """The OpenTelemetry context of a W3C trace context: HTTP request headers, or a record's
    trace headers. ``None`` when it has none that is valid."""
    if not isinstance(carrier, Mapping):
        carrier = {name: value.decode("latin-1") for name, value in carrier}
    if TRACEPARENT not in carrier:
        return None
    context = _PROPAGATOR.extract(carrier)
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


def start_span(
    name: str,
    parent: TraceHeaders | Mapping[str, str] | None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
    start_time: float | None = None,
    links: Sequence[TraceHeaders] = (),
) -> Span:
    """The SDK's span of ``parent`` (a record's trace context, a request's headers; ``None``: a
    new trace) started now or at ``start_time`` (epoch seconds), linked to the spans of ``links``
    (trace contexts); the caller ends it. Only called when tracing is on. A record's spans come
    from ``child_span``, lean where they may be."""
    tracer = _state.tracer
    assert tracer is not None
    linked = []
    for headers in links:
        context = parent_context(headers)
        if context is not None:
            linked.append(trace.Link(trace.get_current_span(context).get_span_context()))
    return tracer.start_span(
        name,
        context=None if parent is None else parent_context(parent),
        kind=kind,
        attributes=attributes,
        start_time=None if start_time is None else int(start_time * 1e9),
        links=linked,
    )


def child_span(
    name: str,
    trace: TraceHeaders,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
    start_time: float | None = None,
    links: Sequence[TraceHeaders] = (),
) -> AnySpan | None:
    """A span of a record's trace context ``trace`` (see ``start_span``) when that is recorded
    here; ``None`` when it is not (no context, tracing off, not sampled), and the context then
    passes on as it came."""
    if not trace or _state.tracer is None:
        return None
    if _state.lean is not None:  # a parent-based sampler: a sampled context's span is kept
        nanos = None if start_time is None else int(start_time * 1e9)
        return _lean_span(name, trace, kind, attributes, nanos, links)
    if not recording(trace):
        return None
    return start_span(name, trace, kind, attributes, start_time, links)


def _lean_span(
    name: str,
    parent: TraceHeaders,
    kind: SpanKind,
    attributes: Mapping[str, Any] | None,
    start_time: int | None,
    links: Sequence[TraceHeaders],
) -> LeanSpan | None:
    """A lean span of a record's sampled trace context, or ``None`` when it has none (not
    sampled, or no ``traceparent``)."""
    ids, state, sampled = _ids_of(parent)
    if ids is None or not sampled:
        return None
    trace_id, parent_id = ids
    return LeanSpan(
        _state.lean,
        name,
        trace_id,
        parent_id,
        state,
        kind,
        attributes,
        start_time,
        _linked(links) if links else [],
    )


def lean() -> Sink | None:
    """Where this process's lean spans go, when it makes them (``begun``)."""
    sink: Sink | None = _state.lean
    return sink


def begun(trace: TraceHeaders) -> Started | None:
    """A lean span of a record's trace context ``trace`` begun now (ended by ``lean().ended``),
    when this process makes lean spans and ``trace`` is sampled; else ``None``."""
    if _state.lean is None or not trace:
        return None
    ids, state, sampled = _ids_of(trace)
    if ids is None or not sampled:
        return None
    return started(ids[0], ids[1], state)


def _linked(links: Sequence[TraceHeaders]) -> list[tuple[bytes, bytes, str]]:
    """The (trace id, span id, trace state) of each of ``links`` that has a valid context."""
    linked = []
    for headers in links:
        found, link_state, _ = _ids_of(headers)
        if found is not None:
            linked.append((found[0], found[1], link_state))
    return linked


def _ids_of(headers: TraceHeaders) -> tuple[tuple[bytes, bytes] | None, str, bool]:
    """The trace and span ids (hex) of a record's ``traceparent`` (``None`` when it has none),
    its ``tracestate`` ("" when none), and whether it is sampled."""
    if len(headers) == 1:  # the common case: a traceparent alone
        header, value = headers[0]
        if header == TRACEPARENT:
            return parse_traceparent(value), "", _sampled(value)
        return None, "", False
    ids = None
    state = ""
    sampled = False
    for header, value in headers:
        if header == TRACEPARENT:
            ids = parse_traceparent(value)
            sampled = _sampled(value)
        elif header == TRACESTATE:
            state = value.decode("ascii", "replace")
    return ids, state, sampled


#: Attributes many spans share: a key naming what they depend on, and what makes them from it
#: (called once a key while lean spans keep them encoded, ``lean_spans.Encoder.block``).
Shared = tuple[Any, Callable[[Any], Mapping[str, Any]]]


def step(
    trace: TraceHeaders,
    name: str,
    attributes: Mapping[str, Any],
    *,
    events: Sequence[tuple[str, Mapping[str, Any]]] = (),
    links: Sequence[TraceHeaders] = (),
    shared: Shared | None = None,
) -> TraceHeaders:
    """A step of a call's journey that takes no time of its own (its routing, a replay): its
    span (ended at once, with ``events`` and ``links``, its ``attributes`` and the ``shared``
    ones), a child of ``trace``, when that is recorded here; the trace context the records it
    makes carry (``trace`` itself when no span is made, if it is ``passed_on``)."""
    lean = _state.lean
    if lean is not None and trace:  # no span object: its fields go to the sink at once
        ids, state, sampled = _ids_of(trace)
        if ids is None or not sampled:
            return passed_on(trace)
        parent = lean.step(
            name,
            ids[0],
            ids[1],
            state,
            attributes,
            events,
            _linked(links) if links else [],
            None if shared is None else lean.block(*shared),
        )
        return _carried(parent, state)
    if shared is not None:
        attributes = {**shared[1](shared[0]), **attributes}
    span = child_span(name, trace, attributes=attributes, links=links)
    if span is None:
        return passed_on(trace)
    for event, event_attributes in events:
        span.add_event(event, event_attributes)
    span.end()
    return headers_of(span)


def _carried(traceparent: bytes, trace_state: str) -> TraceHeaders:
    """A lean span's context as a record's headers."""
    if trace_state:
        return [(TRACEPARENT, traceparent), (TRACESTATE, trace_state.encode())]
    return [(TRACEPARENT, traceparent)]


def headers_of(span: AnySpan) -> TraceHeaders:
    """The trace context of ``span``, as a record's headers (or, decoded, a request's)."""
    if isinstance(span, LeanSpan):
        return _carried(span.traceparent, span.trace_state)
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return [(name, value.encode()) for name, value in carrier.items()]


def cleaned_trace_id(trace: TraceHeaders) -> str:
    """The trace id (32 hex digits) of a trace context ``cleaned`` made ("": none). Its
    ``traceparent`` comes first, of the W3C form: no need to parse it again."""
    return trace[0][1][3:35].decode("ascii") if trace else ""
