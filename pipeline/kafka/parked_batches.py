"""Parked batches: one Kafka record in a retry tier that carries many parked delivery records.

Records parked together (one batch's records for one destination and retry window: a hanging
destination's share of a router batch, or its backlog come due and parked again) wait together
and come back together, so they travel as one record: one produce, one broker copy and one
consume instead of one each (``make bench`` section 3; docs/decisions.md, "Parked together,
carried as one"). The record keeps the park header of its parts, and says how many it carries
in ``PARTS_HEADER``. Its value is each part's key and value, one after the other:

    key length (4 bytes, big-endian; -1: no key), value length (4 bytes), key, value

so batches join by concatenation, and a part is read back without decoding anything.

    >>> items = [(b"hooks/u1", b"first", 0), (None, b"second", 0)]
    >>> [(m.key(), m.value()) for m in unpacked(packed(items), [])]
    [(b'hooks/u1', b'first'), (None, b'second')]
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

__all__ = [
    "PARTS_HEADER",
    "MAX_BYTES",
    "PartMessage",
    "packed",
    "unpacked",
    "entry_size",
    "split_first",
]

#: The header of a parked record that carries several: how many (ASCII digits).
PARTS_HEADER = "pipeline-parked-parts"
#: A parked batch carries at most this many bytes of records (Kafka refuses records over 1 MB by
#: default, ``message.max.bytes``): past it, the next records start another batch.
MAX_BYTES = 256 * 1024

_LENGTHS = struct.Struct(">ii")

Headers = list[tuple[str, str | bytes | None]]


class PartMessage:
    """One record of a parked batch, answering what the handler asks of a consumed message."""

    __slots__ = ("_key", "_value", "_headers")

    def __init__(self, key: bytes | None, value: bytes, headers: Headers) -> None:
        self._key = key
        self._value = value
        self._headers = headers

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
    value: bytes | None, headers: Sequence[tuple[str, str | bytes | None]]
) -> list[PartMessage]:
    """The records a batch's ``value`` carries, each with the batch's ``headers`` but the parts
    count. Raises ``ValueError`` when the value is not a batch's (cut short, or lengths that do
    not add up)."""
    data = value or b""
    kept = [header for header in headers if header[0] != PARTS_HEADER]
    parts: list[PartMessage] = []
    at = 0
    while at < len(data):
        key, part, at = _entry(data, at)
        parts.append(PartMessage(key, part, kept))
    if not parts:
        raise ValueError("an empty batch")
    return parts


def split_first(value: bytes | None) -> tuple[bytes | None, bytes, bytes]:
    """A batch's first record (key, value) and the rest of the batch, its bytes as they are (a
    batch of the others: batches join by concatenation). Raises ``ValueError`` when the value
    does not start with a whole record.

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
