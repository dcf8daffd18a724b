"""OTLP protobuf bytes of spans, written by hand (``Encoder``): a ``Span`` message a span, the
request around them, the standard span limits applied as the SDK applies them (``Limits``).
What ``lean_spans`` sends; ``tests/unit/runtime/test_lean_spans.py`` checks its bytes decode as
the library's encoding of the SDK's spans of the same content."""

from __future__ import annotations

import binascii
import struct
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeVar

from opentelemetry.trace import SpanKind

__all__ = ["Encoder", "Limits", "Block", "SpanFields"]

#: ``Span.flags``: whether the parent is remote is known (0x100), and it is (0x200), as the SDK's
#: encoder writes them for a parent read from a carrier.
_REMOTE_PARENT_FLAGS = 0x300


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


class Block(NamedTuple):
    """Attributes many spans share (an attempt's URL and destination, a routing's call type,
    source and destinations), encoded once (``Encoder.block``)."""

    encoded: bytes
    attributes: Mapping[str, Any]


#: What ``Encoder.spans`` takes of a span: its name, kind, trace id, span id and parent id (hex),
#: start and end (epoch ns), its own attributes, its parent's trace state, its events (name,
#: epoch ns, attributes), its links (trace id, span id, trace state), whether it failed, and the
#: ``Block`` of attributes it shares (``None``: none).
SpanFields = tuple[
    str,
    SpanKind,
    bytes,
    bytes,
    bytes,
    int,
    int,
    Mapping[str, Any],
    str,
    list[tuple[str, int, Mapping[str, Any]]],
    list[tuple[bytes, bytes, str]],
    bool,
    "Block | None",
]


class Encoder:
    """Writes ``ExportTraceServiceRequest`` bytes for lean spans, under one resource (its
    attributes) and one instrumentation scope, applying ``limits``."""

    def __init__(self, resource: Mapping[str, Any], scope: str, limits: Limits) -> None:
        self.limits = limits
        self._known: dict[tuple[bytes, str, type, Any], bytes] = {}
        self._blocks: dict[tuple[Callable[[Any], Mapping[str, Any]], Hashable], Block] = {}
        self._names: dict[str, tuple[SpanKind, bytes]] = {}
        #: A key's field (``KeyValue.key``), by key.
        self._keys: dict[str, bytes] = {}
        self._head = _field(_F1, self._attributes(_F1, b"\x10", resource, None, None))
        self._scope = _field(_F1, _field(_F1, scope.encode()))

    def request(self, spans: Iterable[bytes]) -> bytes:
        """The request carrying ``spans``, each encoded by ``span``: its bytes copied once (a
        request of 2,048 spans is some 600 KB)."""
        parts = [self._scope, *spans]
        inner = sum(map(len, parts))
        scope_spans = _F2 + _varint(inner)
        head = self._head
        return b"".join(
            [_F1, _varint(len(head) + len(scope_spans) + inner), head, scope_spans, *parts]
        )

    def block(self, key: Hashable, make: Callable[[Any], Mapping[str, Any]]) -> Block:
        """The attributes ``make(key)`` gives, encoded once under ``key`` (what they depend on;
        kept by ``make`` and ``key``, so two makers' keys never meet): spans that share them
        pass the ``Block`` to ``encode`` beside their own."""
        kept = (make, key)
        found = self._blocks.get(kept)
        if found is None:
            attributes = dict(make(key))
            encoded = self._attributes(_F9, b"\x50", attributes, None, self.limits.length)
            found = Block(encoded, attributes)
            if len(self._blocks) >= _CACHED:
                self._blocks.clear()
            self._blocks[kept] = found
        return found

    def spans(self, spans: Iterable[SpanFields]) -> bytes:
        """The ``Span`` messages of ``spans``' fields, one after another, as fields of
        ``ScopeSpans`` (one loop for a bundle: a span's own call and lookups cost as much as
        its encoding). A span's ``block``: attributes it shares with other spans, beside its
        own ``attributes`` (none of the same name)."""
        limits = self.limits
        limit, length = limits.attributes, limits.length
        names = self._names
        attributes_of = self._attributes
        times = _TIMES.pack
        out: list[bytes] = []
        for (
            name,
            kind,
            trace_id,
            span_id,
            parent_id,
            start_time,
            end_time,
            attributes,
            trace_state,
            events,
            links,
            error,
            block,
        ) in spans:
            named_as = names.get(name)  # (its kind, the two fields), the kind mostly one
            if named_as is not None and named_as[0] is kind:
                named = named_as[1]
            else:
                named = self._named(name, kind)
            if block is None:
                encoded = attributes_of(_F9, b"\x50", attributes, limit, length)
            elif limit is None or len(block.attributes) + len(attributes) <= limit:
                encoded = block.encoded + attributes_of(_F9, b"\x50", attributes, None, length)
            else:  # over the limit: the oldest dropped, as the SDK drops them
                merged = {**block.attributes, **attributes}
                encoded = attributes_of(_F9, b"\x50", merged, limit, length)
            # trace_id (1), span_id (2) and parent_span_id (4): tags and lengths in hex, unhexed
            # at once; then the name and kind, the times, the attributes.
            body = b"%b%b%b%b" % (
                _unhex(b"0a10%b1208%b2208%b" % (trace_id, span_id, parent_id)),
                named,
                times(0x39, start_time, 0x41, end_time),
                encoded,
            )
            if trace_state:
                body += _field(_F3, trace_state.encode())
            if events:
                body += self._events(events)
            if links:
                body += self._links(links)
            body += _ERROR_END if error else _END
            size = len(body)
            if size < 0x80:
                out.append(_F2 + _LENGTHS[size])
            elif size < 0x4000:  # most spans: a two-byte length
                out.append(bytes((0x12, size & 0x7F | 0x80, size >> 7)))
            else:
                out.append(_F2 + _varint(size))
            out.append(body)
        return b"".join(out)

    def _named(self, name: str, kind: SpanKind) -> bytes:
        """A span's name and kind fields, kept by its name."""
        named = _field(_F5, name.encode()) + _KINDS[kind]
        if len(self._names) >= _CACHED:
            self._names.clear()
        self._names[name] = (kind, named)
        return named

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
            kind = value.__class__
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
                key_field = self._keys.get(key)
                if key_field is None:
                    key_field = _field(_F1, key.encode())
                    if len(self._keys) >= _CACHED:
                        self._keys.clear()
                    self._keys[key] = key_field
                if kind is str:
                    text = (value if length is None else value[:length]).encode()
                    size = len(text)
                    whole = len(key_field) + size + 4
                    if whole < 0x80:  # the KeyValue, its AnyValue and string: one-byte lengths
                        encoded = b"%b%b%b\x12%b\x0a%b%b" % (
                            tag,
                            _LENGTHS[whole],
                            key_field,
                            _LENGTHS[size + 2],
                            _LENGTHS[size],
                            text,
                        )
                    else:
                        encoded = _field(tag, key_field + _field(_F2, _field(_F1, text)))
                else:
                    encoded = _field(tag, key_field + _field(_F2, _value(value, length)))
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
