"""Parked batches: several parked records carried as one Kafka record.

**Parked together, carried as one.** Records parked by one plan from one partition of one batch
(a hanging destination's share of it) travel as one Kafka record carrying them all, up to
``MAX_BYTES``, its ``PARTS_HEADER`` saying how many: one produce, one broker copy and one consume
instead of one each. Its value is each part's key and value, one after the other:

    key length (4 bytes, big-endian; -1: no key), value length (4 bytes), key, value

so batches join by concatenation, and a part is read back without decoding anything. Each part's
trace context (``pipeline.runtime.tracing``) goes in the batch's ``PARTS_TRACE_HEADER``: the
parts' ``traceparent`` in order, space-separated, ``-`` for a part without one (their
``tracestate``, if any, is not kept).

    >>> items = [(b"hooks/u1", b"first", 0), (None, b"second", 0)]
    >>> [(m.key(), m.value()) for m in unpacked(packed(items), [])]
    [(b'hooks/u1', b'first'), (None, b'second')]
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any

from pipeline.runtime.tracing import TRACEPARENT, TraceHeaders, trace_headers

#: The header of a parked record that carries several: how many (ASCII digits).
PARTS_HEADER = "pipeline-parked-parts"
#: The header of a parked record that carries several: each one's ``traceparent`` (``-``: none).
PARTS_TRACE_HEADER = "pipeline-parts-traceparent"
NO_TRACE = b"-"


def trace_of(message: Any) -> TraceHeaders:
    """The trace context a consumed record carries: its own, or a batch's parts' list."""
    headers = message.headers()
    if not headers:
        return []
    for name, value in headers:
        if name == PARTS_TRACE_HEADER and isinstance(value, bytes):
            return [(name, value)]
    return trace_headers(headers)


def trace_entries(trace: TraceHeaders, parts: int) -> list[bytes]:
    """A record's (``parts`` 0) or a batch's entries in a batch's list of traceparents (``trace``:
    ``trace_of``): one a part, ``NO_TRACE`` for a part without one."""
    wanted = PARTS_TRACE_HEADER if parts else TRACEPARENT
    for name, value in trace:
        if name == wanted:
            entries = value.split(b" ")
            if len(entries) == (parts or 1):
                return entries
            break  # not ours: its parts go on without their traces
    return [NO_TRACE] * (parts or 1)


def carried_trace(entries: Sequence[bytes]) -> TraceHeaders:
    """The trace headers of a record carrying the parts of ``entries`` (``trace_entries``): a
    record alone its ``traceparent``, a batch its parts' list; none when no part has one."""
    if len(entries) == 1:
        return [] if entries[0] == NO_TRACE else [(TRACEPARENT, entries[0])]
    if all(entry == NO_TRACE for entry in entries):
        return []
    return [(PARTS_TRACE_HEADER, b" ".join(entries))]


#: A parked batch carries at most this many bytes of records (Kafka refuses records over 1 MB by
#: default, ``message.max.bytes``): past it, the next records start another batch.
MAX_BYTES = 256 * 1024
Headers = list[tuple[str, str | bytes | None]]


# ---- parked batches ------------------------------------------------------------------------------

_LENGTHS = struct.Struct(">ii")


class PartMessage:
    """One record of a parked batch, answering what the handler asks of a consumed message."""

    __slots__ = ("_key", "_value", "_headers", "_timestamp")

    def __init__(
        self,
        key: bytes | None,
        value: bytes,
        headers: Headers,
        timestamp: tuple[int, int] = (0, -1),
    ) -> None:
        self._key = key
        self._value = value
        self._headers = headers
        self._timestamp = timestamp

    def timestamp(self) -> tuple[int, int]:
        """The batch's Kafka timestamp (type, epoch ms)."""
        return self._timestamp

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes:
        return self._value

    def headers(self) -> Headers:
        return self._headers


def entry_size(key: bytes | None, value: bytes | None) -> int:
    """The bytes a record takes in a batch."""
    return _LENGTHS.size + len(key or b"") + len(value or b"")


def packed(items: Iterable[tuple[bytes | None, bytes | None, int]]) -> bytes:
    """The value of a batch of ``items``: (key, value, parts), where ``parts`` 0 says the value
    is a record's, and more that it is a batch's of that many records (joined as it is)."""
    pieces: list[bytes] = []
    for key, value, parts in items:
        if parts:
            pieces.append(value or b"")
            continue
        pieces += (
            _LENGTHS.pack(-1 if key is None else len(key), len(value or b"")),
            key or b"",
            value or b"",
        )
    return b"".join(pieces)


def unpacked(
    value: bytes | None,
    headers: Sequence[tuple[str, Any]],
    timestamp: tuple[int, int] = (0, -1),
) -> list[PartMessage]:
    """The records a batch's ``value`` carries, each with the batch's ``headers`` (but the parts
    count and their traces: each its own) and ``timestamp``. Raises ``ValueError`` when the
    value is not a batch's (cut short, or lengths that do not add up)."""
    data = value or b""
    kept = [h for h in headers if h[0] != PARTS_HEADER and h[0] != PARTS_TRACE_HEADER]
    parts: list[PartMessage] = []
    at = 0
    while at < len(data):
        key, part, at = _entry(data, at)
        parts.append(PartMessage(key, part, kept, timestamp))
    if not parts:
        raise ValueError("an empty batch")
    listed = [(name, value) for name, value in headers if name == PARTS_TRACE_HEADER]
    for message, traceparent in zip(parts, trace_entries(listed, len(parts)), strict=True):
        if traceparent != NO_TRACE:
            message._headers = [*kept, (TRACEPARENT, traceparent)]
    return parts


def split_first(value: bytes | None) -> tuple[bytes | None, bytes, bytes]:
    """A batch's first record (key, value) and the rest of the batch, its bytes as they are (a
    batch of the others). Raises ``ValueError`` when the value does not start with a whole
    record.

    >>> split_first(packed([(b"k1", b"first", 0), (None, b"second", 0)]))[:2]
    (b'k1', b'first')
    """
    data = value or b""
    key, first, end = _entry(data, 0)
    return key, first, data[end:]


def _entry(data: bytes, at: int) -> tuple[bytes | None, bytes, int]:
    """The record (key, value) written at byte ``at`` of a batch's value ``data``, and where the
    next one starts. Raises ``ValueError`` when it is not all there."""
    try:
        key_length, value_length = _LENGTHS.unpack_from(data, at)
    except struct.error as exc:
        raise ValueError(f"a batch cut short at byte {at} of {len(data)}: {exc}") from None
    start = at + _LENGTHS.size
    stop = start + max(key_length, 0)
    end = stop + value_length
    if value_length < 0 or end > len(data):
        raise ValueError(f"a part of {value_length} bytes past the batch's end")
    return (None if key_length < 0 else data[start:stop]), data[stop:end], end
