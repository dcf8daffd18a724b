"""Reading the delivery log back: ``LogBatch``es, and a lone ``LogRecord`` (what the log held
before batches).

``decode_log_records`` reads every schema through the codec, as dicts. ``read_log_batch`` reads a
``LogBatch`` of the current schema straight from its bytes to typed ``LogRecord``s, in about 60 %
of the time of fastavro's dicts and their conversion (the log-store's largest cost after its
database); anything else (an older or newer writer's schema, the Schema Registry's codec, bytes it
does not expect) it leaves to ``decode_log_records``.
"""

from __future__ import annotations

from typing import Any

from pipeline.core.exceptions import UndecodableRecord
from pipeline.core.log_entries import LogEntry, LogKind, LogRecord
from pipeline.kafka.codec import Codec, RecordCodec
from pipeline.kafka.log_batches import ENTRY_TAIL, HEADER_BYTES, NO_DESTINATIONS, kind_bytes

__all__ = ["decode_log_records", "read_log_batch"]

Record = dict[str, Any]


def decode_log_records(codec: RecordCodec, data: bytes | None) -> list[Record]:
    """The ``LogRecord`` dicts of one Kafka record of the log: a ``LogBatch``'s, or a lone
    ``LogRecord`` (an older writer's). Raises ``UndecodableRecord``, naming the batch's error."""
    try:
        records: list[Record] = codec.decode("LogBatch", data)["records"]
        return records
    except UndecodableRecord as batch_error:
        try:
            return [codec.decode("LogRecord", data)]
        except UndecodableRecord:
            raise batch_error from None


#: An entry's kind as written (its length byte, then its name) → the kind.
_KINDS = {kind_bytes(kind): kind for kind in LogKind}
#: An entry's fields from ``destinations`` on at their defaults.
_BLANK = NO_DESTINATIONS + ENTRY_TAIL
#: A ``LogEntry``'s defaults after ``destination``, and after ``size``.
_DEFAULTS = tuple(LogEntry._field_defaults[name] for name in LogEntry._fields[3:])
_DEFAULTS_AFTER_SIZE = _DEFAULTS[3:]
#: A named tuple made without its ``__new__`` (a Python function with defaults): from the
#: whole tuple of fields, in order.
_make = tuple.__new__


def read_log_batch(codec: RecordCodec, data: bytes | None) -> list[LogRecord] | None:
    """The typed records of a ``LogBatch`` written with ``codec``'s current schema, read from its
    bytes; ``None`` for anything else (decode it with ``decode_log_records``, which reads every
    schema and names what is wrong). The same records as ``log_record_from_avro`` makes of the
    dicts (``tests/unit/kafka/test_log_batches.py`` checks it for arbitrary records)."""
    if (
        not isinstance(codec, Codec)
        or data is None
        or not data.startswith(codec.header("LogBatch"))
    ):
        return None
    try:
        records, end = _read_batch(data, HEADER_BYTES)
    except (IndexError, KeyError, ValueError):  # ValueError: UnicodeDecodeError too
        return None
    return records if end == len(data) else None


def _read_batch(data: bytes, pos: int) -> tuple[list[LogRecord], int]:
    """The ``LogBatch`` body at ``pos``: its records, and where it ends. Raises ``IndexError``
    (cut short), ``KeyError`` (an entry kind this version does not know) or ``ValueError``.

    What it spends its time on, made cheap: an entry's kind is looked up by its bytes; a
    time (six bytes of varint these decades) is decoded once per batch, where times repeat
    (a batch's entries were written within milliseconds); empty and short strings take no
    varint loop."""
    times: dict[bytes, int] = {}

    def long() -> int:
        nonlocal pos
        byte = data[pos]
        pos += 1
        if byte < 0x80:
            return (byte >> 1) ^ -(byte & 1)
        n, shift = byte & 0x7F, 7
        while True:
            byte = data[pos]
            pos += 1
            n |= (byte & 0x7F) << shift
            if byte < 0x80:
                return (n >> 1) ^ -(n & 1)
            shift += 7
            if shift > 63:
                raise ValueError("varint longer than 10 bytes")

    def time() -> int:
        """A long that is likely a time in ms. Six bytes equal to a six-byte varint read
        before are that varint (its first five bytes have the high bit, its sixth not)."""
        nonlocal pos
        key = data[pos : pos + 6]
        value = times.get(key)
        if value is not None:
            pos += 6
            return value
        start = pos
        value = long()
        if pos - start == 6:
            times[key] = value
        return value

    def text() -> str:
        nonlocal pos
        byte = data[pos]
        if byte == 0:
            pos += 1
            return ""
        if byte < 0x80:
            size = (byte >> 1) ^ -(byte & 1)
            pos += 1
        else:
            size = long()
        if size < 0 or pos + size > len(data):
            raise ValueError("string length out of the record")
        value = data[pos : pos + size].decode()
        pos += size
        return value

    def optional() -> str | None:
        nonlocal pos
        branch = data[pos]
        pos += 1
        if branch == 0:
            return None
        if branch != 2:
            raise ValueError(f"union branch {branch}")
        return text()

    def count() -> int:
        """The next array block's item count (0: the array ends)."""
        n = long()
        if n < 0:
            long()  # a negative count is followed by the block's size in bytes
            return -n
        return n

    records = []
    n = count()
    while n:
        for _ in range(n):
            message_id, source, call_type = text(), text(), text()
            user_id, anonymous_id, event = optional(), optional(), optional()
            entries = []
            m = count()
            while m:
                for _ in range(m):
                    end = pos + 1 + (data[pos] >> 1)  # a kind's name is under 64 bytes
                    kind = _KINDS[data[pos:end]]
                    pos = end
                    at, destination = time(), text()
                    if data.startswith(_BLANK, pos):  # delivered, and most conclusions
                        pos += len(_BLANK)
                        entries.append(_make(LogEntry, (kind, at, destination) + _DEFAULTS))
                        continue
                    if data.startswith(NO_DESTINATIONS, pos):  # every entry but received and routed
                        pos += len(NO_DESTINATIONS)
                        destinations: tuple[str, ...] = ()
                        reason, size = "", 0
                    else:
                        names = []
                        while k := count():
                            names += [text() for _ in range(k)]
                        destinations = tuple(names)
                        reason, size = text(), long()
                    if data.startswith(ENTRY_TAIL, pos):
                        pos += len(ENTRY_TAIL)
                        fields = (kind, at, destination, destinations, reason, size)
                        entries.append(_make(LogEntry, fields + _DEFAULTS_AFTER_SIZE))
                        continue
                    url = text()
                    branch = data[pos]
                    pos += 1
                    if branch not in (0, 2):
                        raise ValueError(f"union branch {branch}")
                    status = long() if branch else None
                    error, duration, tier, not_before = text(), long(), long(), long()
                    attempt, response, replay_id, body = long(), text(), text(), optional()
                    trace_id = text()
                    whole: tuple[Any, ...] = (kind, at, destination, destinations, reason)
                    whole += (size, url, status)
                    whole += (error, duration, tier, not_before, attempt, response, replay_id, body)
                    whole += (trace_id,)
                    entries.append(_make(LogEntry, whole))
                m = count()
            record = (message_id, source, call_type, user_id, anonymous_id, event, tuple(entries))
            records.append(_make(LogRecord, record))
        n = count()
    return records, pos
