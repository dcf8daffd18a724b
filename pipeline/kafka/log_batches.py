"""Writing the delivery log to Kafka: ``LogRecord``s travel in ``LogBatch``es, one Kafka record a
batch (reading them back: ``pipeline.kafka.log_reading``).

A record on ``deliveries.log`` per call and per attempt made the log cost the pipeline a quarter of
its rate: the broker, librdkafka and the acknowledgement each did per-record work twice over per
delivered call. So every writer batches:

- the router puts a part's records (one consumed batch, one input partition) in the part's
  produce or transaction (``log_batch_records``);
- the delivery handler's attempts end one by one, in their own tasks: ``LogBatcher`` gathers the
  log records of every hand-off made in one turn of the event loop into one produce, and
  finishes their Kafka records once it is acknowledged;
- a DLQ replay puts its ``replayed`` records in its transaction.

The two records every delivered call makes (the router's ``received`` + ``routed``, the delivery
handler's ``attempt`` + ``delivered``) are written straight to Avro bytes from the pipeline's own
objects (``routed_log_body``, ``delivered_log_body``): building the dicts and walking the schema
cost the hot path about twice as much. What repeats in them from call to call is kept as encoded
pieces, and they are written a batch at a time (``Routed``, ``Delivered``), not between the
other steps of a call. Every other record goes through the dict builders of
``pipeline.core.log_entries`` and the codec; ``tests/unit/kafka/test_log_batches.py`` checks that
both give the same bytes. A codec other than ``Codec`` (the Schema Registry's) takes dicts only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from pipeline.core.calls import Call
from pipeline.core.exceptions import BrokerUnavailable
from pipeline.core.log_entries import (
    LOG_BATCH_BYTES,
    LogKind,
    call_log_record,
    conclusion_log_record,
    log_batch,
)
from pipeline.core.outcomes import Failure, Outcome, UrlResult
from pipeline.core.records import Delivery
from pipeline.kafka.avro_writer import (
    LONGS,
    STRINGS,
    long_bytes,
    string_bytes,
    write_long,
    write_string,
)
from pipeline.kafka.codec import Codec, RecordCodec
from pipeline.kafka.errors import Outgoing
from pipeline.kafka.producer import Producing

__all__ = [
    "ENTRY_TAIL",
    "NO_DESTINATIONS",
    "kind_bytes",
    "HEADER_BYTES",
    "Delivered",
    "LogBatcher",
    "LogRecordValue",
    "Routed",
    "delivered_log_body",
    "log_batch_records",
    "routed_log_body",
]
log = logging.getLogger("pipeline.log")

Record = dict[str, Any]


class Routed(NamedTuple):
    """The router's record of a call routed, no destination left out, no body logged (as
    ``call_log_record(call, size, at, destinations=destinations, trace_id=trace_id)`` makes
    it), not written yet."""

    call: Call
    size: int
    at: int
    destinations: list[str]
    trace_id: str = ""


class Delivered(NamedTuple):
    """The delivery handler's record of an attempt (``results``, begun at ``started``) that
    delivered at ``finished``, not written yet."""

    delivery: Delivery
    results: list[UrlResult]
    started: float
    finished: float


#: A ``LogRecord`` to write: the codec's dict, its Avro body, or one of the two every delivered
#: call makes, as its arguments: those are written a batch at a time, when the batch goes out,
#: straight to Avro bytes with ``Codec`` (a third less time than written one by one between the
#: other steps of routing or delivering a call).
LogRecordValue = Record | bytes | Routed | Delivered


def log_batch_records(
    codec: RecordCodec, topic: str, records: Sequence[LogRecordValue], key: bytes | None = None
) -> list[Outgoing]:
    """``records`` as the Kafka records to produce: one ``LogBatch``, cut in halves while larger
    than ``LOG_BATCH_BYTES`` (a lone record goes whatever its size). With ``Codec`` the records
    are written straight to Avro bodies; another codec (the Schema Registry's) gets dicts."""
    if isinstance(codec, Codec):
        return _batches_of_bodies(
            codec.header("LogBatch"), topic, key, [_body(codec, record) for record in records]
        )
    return _batches_of_records(codec, topic, [_record(r) for r in records], key)


def _body(codec: Codec, record: LogRecordValue) -> bytes:
    kind = type(record)
    if kind is bytes:
        return record  # type: ignore[return-value]
    if kind is Routed:
        return routed_log_body(*record)
    if kind is Delivered:
        return delivered_log_body(*record)
    return codec.encode("LogRecord", record)[HEADER_BYTES:]  # type: ignore[arg-type]


def _record(record: LogRecordValue) -> Record:
    if isinstance(record, Routed):
        return call_log_record(
            record.call,
            record.size,
            record.at,
            destinations=record.destinations,
            trace_id=record.trace_id,
        )
    if isinstance(record, Delivered):
        before = record.delivery
        return conclusion_log_record(
            before,
            Outcome.DELIVERED,
            before,
            record.finished,
            results=record.results,
            started=record.started,
        )
    assert isinstance(record, dict), "Avro bodies need the Codec"
    return record


def _batches_of_records(
    codec: RecordCodec, topic: str, records: list[Record], key: bytes | None
) -> list[Outgoing]:
    value = codec.encode("LogBatch", log_batch(records))
    if len(value) <= LOG_BATCH_BYTES or len(records) == 1:
        return [(topic, key, value)]
    half = len(records) // 2
    return _batches_of_records(codec, topic, records[:half], key) + _batches_of_records(
        codec, topic, records[half:], key
    )


def _batches_of_bodies(
    header: bytes, topic: str, key: bytes | None, bodies: list[bytes]
) -> list[Outgoing]:
    """A ``LogBatch`` is its header, then its ``records`` array: the count, the records, 0."""
    if sum(map(len, bodies)) <= LOG_BATCH_BYTES or len(bodies) == 1:
        value = bytearray(header)
        write_long(value, len(bodies))
        value += b"".join(bodies)
        value.append(0)
        return [(topic, key, bytes(value))]
    half = len(bodies) // 2
    return _batches_of_bodies(header, topic, key, bodies[:half]) + _batches_of_bodies(
        header, topic, key, bodies[half:]
    )


#: The single-object header's length (``Codec``): 2 magic bytes and the 8-byte fingerprint.
HEADER_BYTES = 10


def kind_bytes(kind: LogKind) -> bytes:
    out = bytearray()
    write_string(out, kind.value)
    return bytes(out)


_RECEIVED, _ROUTED = kind_bytes(LogKind.RECEIVED), kind_bytes(LogKind.ROUTED)
_ATTEMPT, _DELIVERED = kind_bytes(LogKind.ATTEMPT), kind_bytes(LogKind.DELIVERED)
#: An entry's fields from ``url`` on at their defaults: url "", status null, error "",
#: durationMs 0, tier -1, notBefore 0, attempt 0, response "", replayId "", body null,
#: traceId "".
ENTRY_TAIL = b"\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00"
#: ``destinations`` [], ``reason`` "", ``size`` 0.
NO_DESTINATIONS = b"\x00\x00\x00"


#: What repeats in the router's record of a call routed, by (source, type, event,
#: destinations): the record but its messageId, userId, anonymousId and three numbers, in the
#: pieces between them (``_routed_pieces``).
_RoutedKey = tuple[str, str, str | None, tuple[str, ...]]
_ROUTED_PIECES: dict[_RoutedKey, tuple[bytes, bytes, bytes]] = {}
_ROUTED_PIECES_MAX = 1024
#: The received entry's fields after ``size``, and the routed entry's kind; the same up to its
#: ``traceId`` (``_RECEIVED_TRACED``, the trace id, then ``_ROUTED``).
_RECEIVED_END = ENTRY_TAIL + _ROUTED
_RECEIVED_TRACED = ENTRY_TAIL[:-1]


def _routed_pieces(key: _RoutedKey) -> tuple[bytes, bytes, bytes]:
    source, call_type, event, destinations = key
    named = bytearray()  # messageId is before it; userId and anonymousId after it
    write_string(named, source)
    write_string(named, call_type)
    entries = bytearray()  # the received entry's at after it
    if event is None:
        entries.append(0)
    else:
        entries.append(2)
        write_string(entries, event)
    entries.append(4)  # two entries
    entries += _RECEIVED
    end = bytearray(b"\x00")  # the routed entry's destination "", after its at
    if destinations:
        write_long(end, len(destinations))
        for name in destinations:
            write_string(end, name)
    end.append(0)  # end of destinations
    end += NO_DESTINATIONS[1:]  # reason "", size 0
    end += ENTRY_TAIL
    end.append(0)  # end of entries
    if len(_ROUTED_PIECES) >= _ROUTED_PIECES_MAX:
        _ROUTED_PIECES.clear()
    pieces = _ROUTED_PIECES[key] = (bytes(named), bytes(entries), bytes(end))
    return pieces


def _traced_end(trace_id: str) -> bytes:
    """``_RECEIVED_END`` with ``trace_id`` as the received entry's ``traceId``."""
    out = bytearray(_RECEIVED_TRACED)
    write_string(out, trace_id)
    out += _ROUTED
    return bytes(out)


def _optional_text(text: str | None) -> bytes:
    """``text`` as an Avro ``["null", "string"]``, not remembered (user ids seldom repeat)."""
    if text is None:
        return b"\x00"
    data = text.encode()
    size = len(data)
    return b"\x02" + (LONGS.get(size) or long_bytes(size)) + data


def routed_log_body(
    call: Call, size: int, at: int, destinations: list[str], trace_id: str = ""
) -> bytes:
    """``call_log_record(call, size, at, destinations=destinations, trace_id=trace_id)``'s Avro
    body: the router's record of a call routed, no destination left out, no body logged."""
    key = (call.source_id, call.type.value, call.event, tuple(destinations))
    named, entries, end = _ROUTED_PIECES.get(key) or _routed_pieces(key)
    longs = LONGS
    message_id = call.message_id.encode()
    length = len(message_id)
    received = call.received_at
    return b"".join(
        (
            longs.get(length) or long_bytes(length),
            message_id,
            named,
            _optional_text(call.user_id),
            _optional_text(call.anonymous_id),
            entries,
            longs.get(received) or long_bytes(received),
            NO_DESTINATIONS,  # destination "", destinations [], reason ""
            longs.get(size) or long_bytes(size),
            _traced_end(trace_id) if trace_id else _RECEIVED_END,
            longs.get(at) or long_bytes(at),
            end,
        )
    )


#: What repeats in the record of a call delivered by one webhook's 2xx, by (source, type,
#: destination, URL, status, tier, attempt number): the record but its messageId and three
#: numbers, in the four pieces between them (``_delivered_pieces``).
_DeliveredKey = tuple[str, str, str, str, int, int, int]
_DELIVERED_PIECES: dict[_DeliveredKey, tuple[bytes, bytes, bytes, bytes]] = {}
_DELIVERED_PIECES_MAX = 1024


def _delivered_pieces(key: _DeliveredKey) -> tuple[bytes, bytes, bytes, bytes]:
    source, call_type, destination, url, status, tier, number = key
    head = bytearray()  # messageId is before it; the attempt's startedAt after it
    write_string(head, source)
    write_string(head, call_type)
    head += b"\x00\x00\x00\x04"  # userId, anonymousId, event: null; two entries
    head += _ATTEMPT
    entry = bytearray()  # an entry's destination, destinations [], reason "", size 0
    write_string(entry, destination)
    entry += NO_DESTINATIONS
    named = bytearray(entry)  # the attempt's durationMs after it
    write_string(named, url)
    named.append(2)
    write_long(named, status)
    named.append(0)  # error ""
    tail = bytearray()  # the delivered entry's at after it
    write_long(tail, tier)
    tail.append(0)  # notBefore 0
    write_long(tail, number)
    tail += b"\x00\x00\x00\x00"  # response "", replayId "", body null, traceId ""
    tail += _DELIVERED
    end = (
        bytes(entry) + ENTRY_TAIL + b"\x00"
    )  # the delivered entry's destination on; end of entries
    if len(_DELIVERED_PIECES) >= _DELIVERED_PIECES_MAX:
        _DELIVERED_PIECES.clear()
    pieces = _DELIVERED_PIECES[key] = (bytes(head), bytes(named), bytes(tail), end)
    return pieces


def delivered_log_body(
    before: Delivery, results: list[UrlResult], started: float, finished: float
) -> bytes:
    """``conclusion_log_record(before, DELIVERED, ...)``'s Avro body: the delivery handler's
    record of an attempt (``results``, begun at ``started``) that delivered at ``finished``."""
    number = len({attempt.at for attempt in before.attempts}) + 1 if before.attempts else 1
    if len(results) == 1:
        result = results[0]
        status = result.status
        if result.failure is None and status is not None and not result.response:
            # The common case, one webhook that answered 2xx: four pieces that repeat.
            key = (
                before.source_id,
                before.call_type,
                before.destination_id,
                result.url,
                status,
                before.tier,
                number,
            )
            head, named, tail, end = _DELIVERED_PIECES.get(key) or _delivered_pieces(key)
            longs = LONGS
            at, ms, done = int(started * 1000), int(result.duration * 1000), int(finished * 1000)
            message_id = before.message_id.encode()
            size = len(message_id)
            return b"".join(
                (
                    longs.get(size) or long_bytes(size),
                    message_id,
                    head,
                    longs.get(at) or long_bytes(at),
                    named,
                    longs.get(ms) or long_bytes(ms),
                    tail,
                    longs.get(done) or long_bytes(done),
                    end,
                )
            )
    strings, longs = STRINGS, LONGS
    out = bytearray()
    write_string(out, before.message_id)
    out += strings.get(before.source_id) or string_bytes(before.source_id)
    out += strings.get(before.call_type) or string_bytes(before.call_type)
    out += b"\x00\x00\x00"  # userId, anonymousId, event: null
    requested = [result for result in results if result.failure is not Failure.CIRCUIT_OPEN]
    count = len(requested) + 1
    out += longs.get(count) or long_bytes(count)
    destination = strings.get(before.destination_id) or string_bytes(before.destination_id)
    at = int(started * 1000)
    started_at = longs.get(at) or long_bytes(at)
    tier = longs.get(before.tier) or long_bytes(before.tier)
    for result in requested:
        out += _ATTEMPT
        out += started_at
        out += destination
        out += NO_DESTINATIONS
        out += strings.get(result.url) or string_bytes(result.url)
        status = result.status
        if status is None:
            out.append(0)
        else:
            out.append(2)
            out += longs.get(status) or long_bytes(status)
        error = "" if result.failure is None else result.failure.value
        out += strings.get(error) or string_bytes(error)
        ms = int(result.duration * 1000)
        out += longs.get(ms) or long_bytes(ms)
        out += tier
        out.append(0)  # notBefore 0
        out += longs.get(number) or long_bytes(number)
        if result.response:
            write_string(out, result.response)
            out += b"\x00\x00\x00"  # replayId "", body null, traceId ""
        else:
            out += b"\x00\x00\x00\x00"  # response "", replayId "", body null, traceId ""
    out += _DELIVERED
    at = int(finished * 1000)
    out += longs.get(at) or long_bytes(at)
    out += destination
    out += NO_DESTINATIONS
    out += ENTRY_TAIL
    out.append(0)  # end of entries
    return bytes(out)


class LogBatcher:
    """One produce for the log records added in one turn of the event loop.

    The batch goes out on the next turn, after every task woken in this one has added its
    record. Once Kafka acknowledged it, each record's ``then(arg)`` is called (the delivery
    handler finishes the Kafka record the log record is about): one wake-up for the batch, not a
    future and a task step per record. If ``stop`` comes first, ``then`` is not called: the
    records are read again after a restart."""

    def __init__(
        self, producer: Producing, codec: RecordCodec, topic: str, stop: asyncio.Event
    ) -> None:
        self._producer = producer
        self._codec = codec
        self._topic = topic
        self._stop = stop
        self._pending: list[LogRecordValue] = []
        self._then: list[tuple[Callable[[Any], object], Any]] = []
        self._sending: set[asyncio.Task[None]] = set()

    def add(self, record: LogRecordValue, then: Callable[[Any], object], arg: Any) -> None:
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append(record)
        self._then.append((then, arg))

    def _flush(self) -> None:
        records, then = self._pending, self._then
        self._pending, self._then = [], []
        task = asyncio.create_task(self._send(records, then))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(
        self,
        records: list[LogRecordValue],
        then: list[tuple[Callable[[Any], object], Any]],
    ) -> None:
        try:
            out = log_batch_records(self._codec, self._topic, records)
            await self._producer.send_all_until_acked(out, self._stop)
        except BrokerUnavailable as exc:  # stopping: what is not finished is read again
            log.warning("delivery log: %d records unacknowledged at stop: %s", len(records), exc)
            return
        for call, arg in then:
            call(arg)

    async def aclose(self, timeout: float = 5.0) -> None:
        """Wait (up to ``timeout``) for the batches being sent."""
        await asyncio.sleep(0)  # a batch added in this turn starts sending
        if self._sending:
            await asyncio.wait(self._sending, timeout=timeout)
