"""Spans of a call's journey made and exported without the SDK's per-span machinery.

A worker makes two spans a call (its routing and its attempt) when a trace is sampled. Through the
SDK each cost about 45 µs to make (a ``Span`` with its lock, attribute cleaning, the context
extracted and injected through the propagator) and about 50 µs to encode (the OTLP encoder builds a
protobuf object per attribute and hashes the resource per span): at 100 % sampling that halved a
worker's deliveries per core. Here a span is a plain record (``LeanSpan``): the parent's ids are
read straight from the ``traceparent`` the pipeline carries (already checked to be W3C, see
``tracing.cleaned``). When it ends it is written as OTLP protobuf bytes at once (``Encoder``: the
repeating key-values and names kept encoded), and those bytes wait in the SDK's batch processor;
the exporter (``make_exporter``) puts them in one request under the resource and scope, encoded
once, beside the library's encoding of any SDK span of the same batch (protobuf concatenates
repeated fields).

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

import binascii
import collections
import logging
import random
import re
import struct
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from opentelemetry.trace import SpanKind, StatusCode, TraceFlags

__all__ = [
    "LeanSpan",
    "EncodedSpan",
    "Sink",
    "Limits",
    "Encoder",
    "TRACEPARENT_FORM",
    "parse_traceparent",
    "make_exporter",
]

log = logging.getLogger("pipeline.tracing")

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
#: ``Span.flags``: whether the parent is remote is known (0x100), and it is (0x200), as the SDK's
#: encoder writes them for a parent read from a carrier.
_REMOTE_PARENT_FLAGS = 0x300


#: A ``traceparent`` the pipeline passes on: version 00, exactly (W3C Trace Context), its trace
#: and parent ids (not all zeros) in lower-case hex.
TRACEPARENT_FORM = re.compile(rb"00-((?!0{32})[0-9a-f]{32})-((?!0{16})[0-9a-f]{16})-[0-9a-f]{2}")


def parse_traceparent(value: bytes) -> tuple[bytes, bytes] | None:
    """``(trace id, span id)``, in hex, of a W3C ``traceparent`` of ``TRACEPARENT_FORM``, or
    ``None`` when it is not one (a record someone else produced may carry anything)."""
    if TRACEPARENT_FORM.fullmatch(value) is None:
        return None
    return value[3:35], value[36:52]  # the form is of fixed length


class _Sampled:
    """The part of a span's context the SDK's span processors read: whether it is sampled (a
    lean span always is)."""

    __slots__ = ()
    trace_flags = _SAMPLED


def new_span_id() -> bytes:
    """A span id, in hex (never all zeros: that id is invalid)."""
    span_id = random.getrandbits(64)
    while not span_id:
        span_id = random.getrandbits(64)
    return b"%016x" % span_id


def _traceparent_of(trace_id: bytes, span_id: bytes) -> bytes:
    """The ``traceparent`` of a lean span (ids in hex): always sampled."""
    return b"00-" + trace_id + b"-" + span_id + b"-01"


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
        self.attributes[key] = value

    def set_status(self, status: StatusCode) -> None:
        if status is StatusCode.ERROR:
            self.error = True

    def add_event(self, name: str, attributes: Mapping[str, Any] | None = None) -> None:
        self.events.append((name, time.time_ns(), attributes or {}))

    def end(self, end_time: int | None = None) -> None:
        if self.end_time is not None:
            return
        self.end_time = time.time_ns() if end_time is None else end_time
        self._sink.ended(self)


class EncodedSpan(bytes):
    """An ended lean span, encoded (a ``Span`` message's bytes as a ``ScopeSpans`` field), as it
    waits in the span processor's queue for the exporter: encoded while its data is at hand, it
    keeps no objects alive and leaves the exporter's thread only the request to send."""

    __slots__ = ()
    context = _Sampled()


class Sink:
    """Where lean spans go when they end: encoded, to the span processor (the SDK's batch
    processor, whose exporter is ``make_exporter``'s).

    With ``bundle`` over 1, spans reach the processor in bundles: one ``EncodedSpan`` holding
    the bytes of up to ``bundle`` spans, one after another (protobuf concatenates repeated
    fields, so the exporter's request is the same). Handing the processor a span cost a worker
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
        self._pending: collections.deque[bytes] = collections.deque()
        self._stopped = threading.Event()
        if bundle > 1:
            threading.Thread(
                target=self._hand_over_every, args=(wait,), name="lean-spans", daemon=True
            ).start()

    def ended(self, span: LeanSpan) -> None:
        self._put(self._encoder.span(span))

    def _put(self, encoded: bytes) -> None:
        pending = self._pending
        pending.append(encoded)
        if len(pending) >= self._bundle:
            self.hand_over()

    def hand_over(self) -> None:
        """Hand the spans pending in a bundle to the processor now."""
        pending, taken = self._pending, []
        try:
            for _ in range(len(pending)):
                taken.append(pending.popleft())
        except IndexError:  # the other thread took the rest
            pass
        if taken:
            self._processor.on_end(EncodedSpan(b"".join(taken)))

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
    ) -> bytes:
        """A span that ends as it starts (a step of a call's journey), its ``events`` at that
        moment, encoded to the span processor at once, with no ``LeanSpan`` made: what a
        ``LeanSpan`` of the same content, ended at once, would send. Its ``traceparent``."""
        span_id = new_span_id()
        now = time.time_ns()
        encoded = self._encoder.encode(
            name,
            SpanKind.INTERNAL,
            trace_id,
            span_id,
            parent_id,
            now,
            now,
            attributes,
            trace_state,
            [(event, now, event_attributes) for event, event_attributes in events],
            links,
            False,
        )
        self._put(encoded)
        return _traceparent_of(trace_id, span_id)


class Limits:
    """The span limits of the standard variables (the SDK's ``SpanLimits``), as the encoder
    applies them: attributes, events and links a span keeps, and the length of a string value."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace import SpanLimits

        limits = SpanLimits()
        self.attributes: int | None = limits.max_span_attributes
        self.events: int | None = limits.max_events
        self.links: int | None = limits.max_links
        self.event_attributes: int | None = limits.max_event_attributes
        self.length: int | None = limits.max_span_attribute_length
        self.event_length: int | None = limits.max_attribute_length


# -- protobuf ------------------------------------------------------------------------------------
# Each message is written as its bytes: a length-delimited field is its tag (field number << 3 | 2,
# one byte for the numbers used here), its length as a varint, and its payload.

_LENGTHS = [bytes((n,)) for n in range(0x80)]
_unhex = binascii.unhexlify
_FIXED64 = struct.Struct("<Q")
_FIXED32 = struct.Struct("<I")
_DOUBLE = struct.Struct("<d")
#: A span's start_time_unix_nano (7) and end_time_unix_nano (8), fixed64 each, with their tags.
_TIMES = struct.Struct("<BQBQ")


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _LENGTHS[value]
    if value < 0x4000:  # a span's length, mostly
        return bytes((value & 0x7F | 0x80, value >> 7))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field (bytes, a string, a message) with its one-byte ``tag``."""
    size = len(payload)
    return tag + (_LENGTHS[size] if size < 0x80 else _varint(size)) + payload


_F1, _F2, _F3, _F4, _F5, _F7 = b"\x0a", b"\x12", b"\x1a", b"\x22", b"\x2a", b"\x3a"
_F9, _F11, _F13, _F15 = b"\x4a", b"\x5a", b"\x6a", b"\x7a"
# The span kinds as OTLP numbers them (the API's are one less: INTERNAL is 0 there, 1 here).
_KINDS = {kind: bytes((0x30, kind.value + 1)) for kind in SpanKind}
# A span's end: its status, then its flags (field 16, fixed32: a two-byte tag).
_SPAN_FLAGS = b"\x85\x01" + _FIXED32.pack(_REMOTE_PARENT_FLAGS)
_END = _field(_F15, b"") + _SPAN_FLAGS
_ERROR_END = _field(_F15, b"\x18\x02") + _SPAN_FLAGS
# A link's flags (field 6, fixed32).
_LINK_FLAGS = b"\x35" + _FIXED32.pack(_REMOTE_PARENT_FLAGS)
#: Key-values and span names an encoder keeps encoded (most repeat: a destination, a URL, a call
#: type, ``POST``).
_CACHED = 4096
#: Attributes whose values do not repeat: encoded each time, never kept (they would only push
#: out the ones that do).
_UNIQUE = frozenset({"pipeline.message_id"})


class Encoder:
    """Writes ``ExportTraceServiceRequest`` bytes for lean spans, under one resource (its
    attributes) and one instrumentation scope, applying ``limits``."""

    def __init__(self, resource: Mapping[str, Any], scope: str, limits: Limits) -> None:
        self.limits = limits
        self._known: dict[tuple[bytes, str, type, Any], bytes] = {}
        self._head = _field(_F1, self._attributes(_F1, b"\x10", resource, None, None))
        self._scope = _field(_F1, _field(_F1, scope.encode()))

    def request(self, spans: Iterable[bytes]) -> bytes:
        """The request carrying ``spans``, each encoded by ``span``."""
        scope_spans = self._scope + b"".join(spans)
        return _field(_F1, self._head + _field(_F2, scope_spans))

    def span(self, span: LeanSpan) -> bytes:
        """An ended span's ``Span`` message, as a field of ``ScopeSpans``."""
        assert span.end_time is not None
        return self.encode(
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
        )

    def encode(
        self,
        name: str,
        kind: SpanKind,
        trace_id: bytes,
        span_id: bytes,
        parent_id: bytes,
        start_time: int,
        end_time: int,
        attributes: Mapping[str, Any],
        trace_state: str,
        events: list[tuple[str, int, Mapping[str, Any]]],
        links: list[tuple[bytes, bytes, str]],
        error: bool,
    ) -> bytes:
        """A span's ``Span`` message of these fields, as a field of ``ScopeSpans``."""
        limits = self.limits
        # trace_id (1), span_id (2) and parent_span_id (4): tags and lengths in hex, one unhex.
        ids = _unhex(b"0a10" + trace_id + b"1208" + span_id + b"2208" + parent_id)
        named = self._known.get((b"", name, SpanKind, kind))
        if named is None:
            named = _field(_F5, name.encode()) + _KINDS[kind]
            self._keep((b"", name, SpanKind, kind), named)
        body = (
            ids
            + named
            + _TIMES.pack(0x39, start_time, 0x41, end_time)
            + self._attributes(_F9, b"\x50", attributes, limits.attributes, limits.length)
        )
        if trace_state:
            body += _field(_F3, trace_state.encode())
        if events:
            body += self._events(events)
        if links:
            body += self._links(links)
        return _field(_F2, body + (_ERROR_END if error else _END))

    def _events(self, events: list[tuple[str, int, Mapping[str, Any]]]) -> bytes:
        limits = self.limits
        kept, dropped = _kept(events, limits.events)
        parts = []
        for name, stamp, attributes in kept:
            event = (
                b"\x09"
                + _FIXED64.pack(stamp)
                + _field(_F2, name.encode())
                + self._attributes(
                    _F3, b"\x20", attributes, limits.event_attributes, limits.event_length
                )
            )
            parts.append(_field(_F11, event))
        if dropped:
            parts.append(b"\x60" + _varint(dropped))
        return b"".join(parts)

    def _links(self, links: list[tuple[bytes, bytes, str]]) -> bytes:
        kept, dropped = _kept(links, self.limits.links)
        parts = []
        for trace_id, span_id, trace_state in kept:
            link = _unhex(b"0a10" + trace_id + b"1208" + span_id)
            if trace_state:
                link += _field(_F3, trace_state.encode())
            parts.append(_field(_F13, link + _LINK_FLAGS))
        if dropped:
            parts.append(b"\x70" + _varint(dropped))
        return b"".join(parts)

    def _keep(self, key: tuple[bytes, str, type, Any], encoded: bytes) -> None:
        if len(self._known) >= _CACHED:
            self._known.clear()
        self._known[key] = encoded

    def _attributes(
        self,
        tag: bytes,
        dropped_tag: bytes,
        attributes: Mapping[str, Any],
        limit: int | None,
        length: int | None,
    ) -> bytes:
        """The repeated ``KeyValue`` field with ``tag``: the last ``limit`` attributes, strings
        cut to ``length``, and how many were dropped (field ``dropped_tag``), as the SDK keeps
        them."""
        out: list[bytes] = []
        known = self._known
        items: Any = attributes.items()
        dropped = 0
        if limit is not None and len(attributes) > limit:
            items, dropped = _kept(list(items), limit)
        cached: Any
        for key, value in items:
            kind = type(value)
            if key in _UNIQUE:
                cached = None
            elif kind is list:  # a short list of strings (a call's destinations)
                cached = (tag, key, kind, tuple(value))
            elif kind is str or kind is int or kind is float or kind is bool:
                cached = (tag, key, kind, value)
            else:
                cached = None
            try:
                encoded = known.get(cached) if cached is not None else None
            except TypeError:  # a list of what cannot be a key
                encoded = cached = None
            if encoded is None:
                pair = _field(_F1, key.encode()) + _field(_F2, _value(value, length))
                encoded = _field(tag, pair)
                if cached is not None:
                    self._keep(cached, encoded)
            out.append(encoded)
        if dropped:
            out.append(dropped_tag + _varint(dropped))
        return b"".join(out)


_T = TypeVar("_T")


def _kept(items: list[_T], limit: int | None) -> tuple[list[_T], int]:
    """The last ``limit`` of ``items`` and how many were dropped (the SDK drops the oldest)."""
    if limit is None or len(items) <= limit:
        return items, 0
    return (items[-limit:] if limit else []), len(items) - limit


def _value(value: Any, length: int | None) -> bytes:
    """An ``AnyValue`` message's bytes, a string cut to ``length`` (``None``: an empty one, as
    the SDK sends it)."""
    if value is None:
        return b""
    if isinstance(value, str):
        return _field(_F1, (value if length is None else value[:length]).encode())
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _field(_F7, value)
    if isinstance(value, Sequence):
        return _field(_F5, b"".join(_field(_F1, _value(item, length)) for item in value))
    return _field(_F1, str(value).encode())


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
