"""Spans of a call's journey made and exported without the SDK's per-span machinery.

A worker makes two spans a call (its routing and its attempt) when a trace is sampled. Through the
SDK each cost about 45 µs to make (a ``Span`` with its lock, attribute cleaning, the context
extracted and injected through the propagator) and about 50 µs to encode (the OTLP encoder builds a
protobuf object per attribute and hashes the resource per span): at 100 % sampling that halved a
worker's deliveries per core. Here a span is a plain record (``LeanSpan``): the parent's ids are
read straight from the ``traceparent`` the pipeline carries (already checked to be W3C, see
``tracing.cleaned``); the hot ones (a routing, an attempt) are not even objects, only their fields
(``Sink.step``, ``Sink.ended``). Their bundle is written as OTLP protobuf bytes when it is handed
to the SDK's batch processor (``Encoder``: the repeating key-values and names kept encoded, the
attributes many spans share encoded once, ``Encoder.block``); the exporter (``make_exporter``)
puts the bytes in one request under the resource and scope, encoded once, beside the library's
encoding of any SDK span of the same batch (protobuf concatenates repeated fields).

Only spans whose parent is a sampled context from a record are lean, and only while the sampler is
parent-based (it then keeps every such span, as the SDK would); the rest (a new trace at ingestion,
another sampler, the console exporter) go through the SDK. The span limits of the standard
variables (``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT`` and the like) are applied when encoding.

The exporter is the library's OTLP/HTTP one (endpoint, headers, TLS, compression, retries, all from
``OTEL_EXPORTER_OTLP_*``) with its ``export`` replaced; it sends through the library's HTTP client
(``_client``), a private attribute: the package is pinned to the minor version this was written
against, and ``tests/unit/runtime/test_lean_spans.py`` exports through it to a real collector.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, NamedTuple

from opentelemetry.trace import SpanKind, StatusCode, TraceFlags

from pipeline.runtime.otlp_encoder import Block, Encoder, Limits, SpanFields

__all__ = [
    "LeanSpan",
    "EncodedSpan",
    "Block",
    "Started",
    "started",
    "Sink",
    "Limits",
    "Encoder",
    "parse_traceparent",
    "make_exporter",
]

log = logging.getLogger("pipeline.tracing")

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


#: The last ``traceparent`` found of the form, and its ids: a router checks a call's context
#: (``tracing.cleaned``) and reads its ids for the routing span just after, one check for both.
#: (It is kept, so no other object can have its identity.)
_last_parsed: tuple[bytes, tuple[bytes, bytes]] = (b"", (b"", b""))


def parse_traceparent(value: bytes) -> tuple[bytes, bytes] | None:
    """``(trace id, span id)``, in hex, of a ``traceparent`` the pipeline passes on, or ``None``
    when it is not one (a record someone else produced may carry anything): W3C Trace Context's
    version 00, exactly, its trace and parent ids (not all zeros) and its flags in lower-case
    hex."""
    global _last_parsed
    last = _last_parsed
    if value is last[0]:
        return last[1]
    # The form, checked without a regex (two thirds of its time): every hex digit made a "0"
    # leaves the form's shape; then the version, and ids not all zeros.
    if (
        len(value) != 55
        or value.translate(_HEX_AS_ZERO) != _SHAPE
        or value[:3] != b"00-"
        or value[3:35] == _NO_TRACE
        or value[36:52] == _NO_SPAN
    ):
        return None
    ids = value[3:35], value[36:52]
    _last_parsed = (value, ids)
    return ids


_HEX_AS_ZERO = bytes.maketrans(b"0123456789abcdef", b"0" * 16)
_NO_TRACE, _NO_SPAN = b"0" * 32, b"0" * 16  # the invalid ids
_SHAPE = b"00-" + _NO_TRACE + b"-" + _NO_SPAN + b"-00"


class _Sampled:
    """The part of a span's context the SDK's span processors read: whether it is sampled (a
    lean span always is)."""

    __slots__ = ()
    trace_flags = _SAMPLED


_random_bits = random.getrandbits


def new_span_id() -> bytes:
    """A span id, in hex (never all zeros: that id is invalid, and 1 is drawn instead)."""
    return b"%016x" % (_random_bits(64) or 1)


def _traceparent_of(trace_id: bytes, span_id: bytes) -> bytes:
    """The ``traceparent`` of a lean span (ids in hex): always sampled."""
    return b"00-" + trace_id + b"-" + span_id + b"-01"


class Started(NamedTuple):
    """A lean span begun and not yet ended, as little as it needs (``Sink.ended``): its ids in
    hex, its parent's trace state, when it began (epoch ns), and its own ``traceparent``."""

    trace_id: bytes
    parent_id: bytes
    trace_state: str
    span_id: bytes
    time: int
    traceparent: bytes


def started(trace_id: bytes, parent_id: bytes, trace_state: str) -> Started:
    """A lean span of that parent begun now."""
    span_id = new_span_id()
    # (``tuple.__new__``: a ``NamedTuple``'s own ``__new__`` is a Python function, twice the cost)
    return _new_tuple(
        Started,
        (
            trace_id,
            parent_id,
            trace_state,
            span_id,
            time.time_ns(),
            _traceparent_of(trace_id, span_id),
        ),
    )


_new_tuple = tuple.__new__


class LeanSpan:
    """A sampled span whose parent came from a record's trace context (``trace_id`` and
    ``parent_id`` in hex, as it carries them). The caller sets it up and ends it as it would an
    SDK span (``set_attribute``, ``set_status``, ``add_event``, ``end``); ended, it goes to its
    ``Sink``."""

    __slots__ = (
        "name",
        "kind",
        "trace_id",
        "span_id",
        "parent_id",
        "trace_state",
        "traceparent",
        "attributes",
        "events",
        "links",
        "error",
        "start_time",
        "end_time",
        "_sink",
    )

    def __init__(
        self,
        sink: Sink,
        name: str,
        trace_id: bytes,
        parent_id: bytes,
        trace_state: str,
        kind: SpanKind,
        attributes: Mapping[str, Any] | None,
        start_time: int | None,
        links: list[tuple[bytes, bytes, str]],
    ) -> None:
        self._sink = sink
        self.name = name
        self.kind = kind
        self.trace_id = trace_id
        self.parent_id = parent_id
        self.span_id = new_span_id()
        #: Its own context as a record or a request carries it on.
        self.traceparent = _traceparent_of(trace_id, self.span_id)
        self.trace_state = trace_state
        self.attributes: dict[str, Any] = dict(attributes) if attributes else {}
        self.events: list[tuple[str, int, Mapping[str, Any]]] = []
        self.links = links
        self.error = False
        self.start_time = time.time_ns() if start_time is None else start_time
        self.end_time: int | None = None

    def set_attribute(self, key: str, value: Any) -> None:
        if self.end_time is None:  # ended, it is the sink's (as the SDK, which ignores it)
            self.attributes[key] = value

    def set_status(self, status: StatusCode) -> None:
        if status is StatusCode.ERROR and self.end_time is None:
            self.error = True

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        if self.end_time is None:
            self.events.append((name, time.time_ns(), attributes or {}))

    def end(self, end_time: int | None = None) -> None:
        if self.end_time is not None:
            return
        self.end_time = time.time_ns() if end_time is None else end_time
        self._sink.span_ended(self)


def _fields_of(span: LeanSpan) -> SpanFields:
    """What ``Encoder.spans`` is given for an ended ``span``."""
    assert span.end_time is not None
    return (
        span.name,
        span.kind,
        span.trace_id,
        span.span_id,
        span.parent_id,
        span.start_time,
        span.end_time,
        span.attributes,
        span.trace_state,
        span.events,
        span.links,
        span.error,
        None,
    )


class EncodedSpan(bytes):
    """Ended lean spans, encoded (``Span`` messages' bytes as ``ScopeSpans`` fields), as they
    wait in the span processor's queue for the exporter: encoded before they wait, they keep no
    objects alive and leave the exporter's thread only the request to send."""

    __slots__ = ()
    context = _Sampled()


class Sink:
    """Where lean spans go when they end: to the span processor (the SDK's batch processor,
    whose exporter is ``make_exporter``'s), encoded.

    With ``bundle`` over 1, spans reach the processor in bundles: one ``EncodedSpan`` holding
    the bytes of up to ``bundle`` spans, one after another (protobuf concatenates repeated
    fields, so the exporter's request is the same). A span waits for its bundle as the fields
    ``Encoder.spans`` takes, and a bundle's spans are encoded together as it is handed over
    (a span that cannot be is left out, and said). Handing the processor a span cost a worker
    some 6 µs (its checks, its queue, a ``getpid``), twice a sampled call. A bundle waits at
    most ``wait`` seconds (a thread hands over what is pending), and the processor's sizes are
    then counted in bundles (``tracing.configure`` divides them). As a span processor of the
    provider (``on_end`` and the like do nothing), its ``shutdown`` and ``force_flush`` hand the
    pending bundle over first, then end or flush its processor."""

    def __init__(
        self, processor: Any, encoder: Encoder, bundle: int = 1, wait: float = 0.5
    ) -> None:
        self._processor = processor
        self._encoder = encoder
        self._bundle = bundle
        #: Spans not yet handed over. Appended by the event loop, popped by whichever thread
        #: hands a bundle over (each span popped once: a deque's ends are safe between threads).
        self._pending: collections.deque[SpanFields] = collections.deque()
        self._stopped = threading.Event()
        #: Held while a bundle is taken, encoded and handed over: a flush or the shutdown waits
        #: for the one the other thread is encoding, and one thread encodes at a time.
        self._handing = threading.Lock()
        self._thread: threading.Thread | None = None
        #: ``Encoder.block``: attributes spans share, encoded once.
        self.block: Callable[[Hashable, Callable[[Any], Mapping[str, Any]]], Block] = encoder.block
        if bundle > 1:
            self._thread = threading.Thread(
                target=self._hand_over_every, args=(wait,), name="lean-spans", daemon=True
            )
            self._thread.start()

    def span_ended(self, span: LeanSpan) -> None:
        self._put(_fields_of(span))

    def _put(self, fields: SpanFields) -> None:
        pending = self._pending
        pending.append(fields)
        if len(pending) >= self._bundle:
            self.hand_over()

    def hand_over(self) -> None:
        """Hand the spans pending in a bundle to the processor now, encoded."""
        with self._handing:
            pending, taken = self._pending, []
            for _ in range(len(pending)):
                taken.append(pending.popleft())
            if not taken:
                return
            spans = self._encoder.spans
            try:
                encoded = spans(taken)
            except Exception:  # a value no span can carry: the others go, that one is said
                parts = []
                for fields in taken:
                    try:
                        parts.append(spans((fields,)))
                    except Exception as error:
                        log.error("tracing: span %r could not be encoded: %s", fields[0], error)
                encoded = b"".join(parts)
            if encoded:
                self._processor.on_end(EncodedSpan(encoded))

    def _hand_over_every(self, wait: float) -> None:
        while not self._stopped.wait(wait):
            self.hand_over()

    # ---- as a span processor of the provider

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def _on_ending(self, span: Any) -> None:
        pass

    def on_end(self, span: Any) -> None:
        pass

    def shutdown(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.hand_over()
        self._processor.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.hand_over()
        return bool(self._processor.force_flush(timeout_millis))

    def step(
        self,
        name: str,
        trace_id: bytes,
        parent_id: bytes,
        trace_state: str,
        attributes: Mapping[str, Any],
        events: Sequence[tuple[str, Mapping[str, Any]]],
        links: list[tuple[bytes, bytes, str]],
        block: Block | None = None,
    ) -> bytes:
        """A span that ends as it starts (a step of a call's journey), its ``events`` at that
        moment, to the span processor at once, with no ``LeanSpan`` made: what a
        ``LeanSpan`` of the same content, ended at once, would send (``block``: attributes it
        shares with others, ``Encoder.block``). Its ``traceparent``. ``attributes`` and the
        events' are encoded with the bundle, later: they must not change after."""
        span_id = new_span_id()
        now = time.time_ns()
        self._put(
            (
                name,
                SpanKind.INTERNAL,
                trace_id,
                span_id,
                parent_id,
                now,
                now,
                attributes,
                trace_state,
                [(event, now, event_attributes) for event, event_attributes in events]
                if events
                else [],
                links,
                False,
                block,
            )
        )
        return _traceparent_of(trace_id, span_id)

    def ended(
        self,
        name: str,
        kind: SpanKind,
        started: Started,
        attributes: Mapping[str, Any],
        block: Block | None,
        error: bool,
    ) -> None:
        """A span begun as ``started`` ends now, with no ``LeanSpan`` made (an attempt's: its
        request sent, its answer in): to the span processor, as a ``LeanSpan`` of the same
        content would go. ``attributes`` are encoded with the bundle, later: they must not
        change after."""
        self._put(
            (
                name,
                kind,
                started.trace_id,
                started.span_id,
                started.parent_id,
                started.time,
                time.time_ns(),
                attributes,
                started.trace_state,
                [],
                [],
                error,
                block,
            )
        )


def make_exporter(encoder: Encoder) -> Any:
    """The OTLP/HTTP span exporter (configured by the ``OTEL_EXPORTER_OTLP_*`` variables) that
    sends ``EncodedSpan``s in ``encoder``'s request, beside any other span, encoded by the
    library's encoder."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    class OtlpExporter(OTLPSpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            if self._shutdown:
                return SpanExportResult.FAILURE
            lean = [span for span in spans if type(span) is EncodedSpan]
            with self._metrics.export_operation(len(spans)) as result:
                try:
                    data = encoder.request(lean) if lean else b""
                    if len(lean) < len(spans):
                        others = [span for span in spans if type(span) is not EncodedSpan]
                        data += encode_spans(others).SerializePartialToString()
                except Exception as error:  # as the library's exporter: the batch is lost
                    log.error("tracing: could not encode %d spans: %s", len(spans), error)
                    result.error = error
                    return SpanExportResult.FAILURE
                sent = self._client.export(data)
                if not sent.success:
                    result.error = sent.error
                    return SpanExportResult.FAILURE
            return SpanExportResult.SUCCESS

    return OtlpExporter()
