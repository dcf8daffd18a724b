"""The delivery log's Kafka records: ``LogBatch``es (cut in pieces when large), read back with the
lone ``LogRecord``s of older writers, and ``LogBatcher``'s one produce per event-loop turn."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.calls import Call, CallType
from pipeline.core.exceptions import BrokerUnavailable, UndecodableRecord
from pipeline.core.log_entries import (
    LOG_BATCH_BYTES,
    LogKind,
    call_log_record,
    conclusion_log_record,
    entry,
    log_batch,
    log_record,
    log_record_from_avro,
)
from pipeline.core.outcomes import Failure, Outcome, UrlResult
from pipeline.core.records import Attempt, Delivery
from pipeline.kafka.codec import Codec
from pipeline.kafka.log_batches import (
    Delivered,
    LogBatcher,
    Routed,
    delivered_log_body,
    log_batch_records,
    routed_log_body,
)
from pipeline.kafka.log_reading import decode_log_records, read_log_batch
from pipeline.kafka.registry_codec import RegistryCodec

CODEC = Codec.default()
CODEC_HEADER = len(CODEC.header("LogRecord"))


def record(message_id: str, response: str = "") -> dict[str, Any]:
    attempt = entry(LogKind.ATTEMPT, 1, destination="d", status=500, response=response)
    return log_record(message_id, "web", "track", [attempt])


def test_a_batch_is_one_kafka_record_and_reads_back_in_order() -> None:
    records = [record(f"m{i}") for i in range(3)]
    ((topic, key, value),) = log_batch_records(CODEC, "t.log", records, b"2")
    assert (topic, key) == ("t.log", b"2")
    assert decode_log_records(CODEC, value) == records


def test_a_large_batch_is_cut_in_pieces_under_the_limit() -> None:
    records = [record(f"m{i}", response="x" * 1024) for i in range(1200)]  # ~1.3 MB in all
    out = log_batch_records(CODEC, "t.log", records)
    assert len(out) > 2
    assert all(len(value) <= LOG_BATCH_BYTES for _, _, value in out)
    read = [r for _, _, value in out for r in decode_log_records(CODEC, value)]
    assert read == records


def test_a_lone_record_larger_than_the_limit_still_goes() -> None:
    huge = log_record("m1", "web", "track", [entry(LogKind.RECEIVED, 1, body="x" * 600_000)])
    ((_, _, value),) = log_batch_records(CODEC, "t.log", [huge])
    assert decode_log_records(CODEC, value) == [huge]


def test_a_lone_log_record_of_an_older_writer_reads_as_one() -> None:
    value = CODEC.encode("LogRecord", record("m1"))
    assert decode_log_records(CODEC, value) == [record("m1")]


def test_what_is_neither_names_the_batch_error() -> None:
    with pytest.raises(UndecodableRecord, match="no C3 01 header"):
        decode_log_records(CODEC, b"junk")
    delivery_like = CODEC.encode("Source", {"id": "web", "name": "Web"})
    with pytest.raises(UndecodableRecord, match="corrupt LogBatch record"):
        decode_log_records(CODEC, delivery_like)


class Producer:
    """Acknowledges what it is given, or refuses it while ``down``."""

    def __init__(self, down: bool = False) -> None:
        self.sent: list[list[Any]] = []
        self.down = down

    async def send_all_until_acked(self, records: Any, stop: asyncio.Event | None = None) -> None:
        await asyncio.sleep(0)
        if self.down:
            raise BrokerUnavailable("1 records unacknowledged: down for the test")
        self.sent.append(list(records))


def test_records_of_one_turn_go_in_one_produce_and_finish_after_it() -> None:
    producer, finished = Producer(), []

    async def go() -> None:
        batcher = LogBatcher(producer, CODEC, "t.log", asyncio.Event())  # type: ignore[arg-type]
        for i in range(3):
            batcher.add(record(f"m{i}"), finished.append, i)
        assert finished == []  # not before Kafka has them
        await asyncio.sleep(0)  # the next turn: the batch goes
        batcher.add(record("m3"), finished.append, 3)  # a later turn: the next batch
        await batcher.aclose()

    asyncio.run(go())
    assert [len(produce) for produce in producer.sent] == [1, 1]
    first = decode_log_records(CODEC, producer.sent[0][0][2])
    assert [r["messageId"] for r in first] == ["m0", "m1", "m2"]
    assert finished == [0, 1, 2, 3]


def test_a_delivered_calls_arguments_are_written_when_its_batch_goes() -> None:
    producer, finished = Producer(), []
    before = Delivery("m1", "d", "web", "track", b"{}", 1)
    results = [UrlResult("http://h/a", 200, None, "", 0.01)]

    async def go() -> None:
        batcher = LogBatcher(producer, CODEC, "t.log", asyncio.Event())  # type: ignore[arg-type]
        batcher.add(record("m0"), finished.append, 0)
        batcher.add(Delivered(before, results, 7.0, 7.5), finished.append, 1)
        await batcher.aclose()

    asyncio.run(go())
    ((produce,),) = producer.sent
    delivered = conclusion_log_record(
        before, Outcome.DELIVERED, before, 7.5, results=results, started=7.0
    )
    assert decode_log_records(CODEC, produce[2]) == [record("m0"), delivered]
    assert finished == [0, 1]


class DictsOnly:
    """A codec that takes dicts only (as the Schema Registry's does)."""

    def encode(self, name: str, record: dict[str, Any]) -> bytes:
        assert isinstance(record, dict)
        return CODEC.encode(name, record)


def test_the_hot_records_go_as_dicts_to_a_codec_without_avro_bodies() -> None:
    """Roles hand ``Routed`` and ``Delivered`` over whatever the codec; ``log_batch_records``
    writes them straight to Avro bodies with ``Codec`` and as the dict builders' dicts with
    another codec: the same records either way."""
    call = Call(CallType.TRACK, "m9", "web", timestamp=1, received_at=1, user_id="u", event="E")
    before = Delivery("m1", "d", "web", "track", b"{}", 1)
    results = [UrlResult("http://h/a", 200, None, "", 0.01)]
    entries = [record("m0"), Routed(call, 10, 2, ["d"]), Delivered(before, results, 7.0, 7.5)]
    expected = [
        record("m0"),
        call_log_record(call, 10, 2, destinations=["d"]),
        conclusion_log_record(before, Outcome.DELIVERED, before, 7.5, results=results, started=7.0),
    ]
    for codec in (CODEC, DictsOnly()):
        [(_, _, value)] = log_batch_records(codec, "t.log", entries)  # type: ignore[arg-type]
        assert decode_log_records(CODEC, value) == expected


def test_records_not_acknowledged_at_stop_are_not_finished() -> None:
    producer, finished = Producer(down=True), []

    async def go() -> None:
        stop = asyncio.Event()
        stop.set()
        batcher = LogBatcher(producer, CODEC, "t.log", stop)  # type: ignore[arg-type]
        batcher.add(record("m1"), finished.append, 1)
        await batcher.aclose()

    asyncio.run(go())
    assert finished == []  # read again after a restart


# ---- the two hot records, written straight to bytes ---------------------------------------------

_TEXT = st.text(max_size=40)
#: Past 63 bytes a string's length takes two varint bytes.
_OPTIONAL = st.none() | st.text(min_size=1, max_size=80) | st.sampled_from(["x" * 63, "é" * 32])


@settings(max_examples=200, deadline=None)
@given(
    message_id=st.text(min_size=1, max_size=80),
    source=_TEXT,
    user=_OPTIONAL,
    anonymous=_OPTIONAL,
    event=_OPTIONAL,
    size=st.integers(0, 2**31 - 1),
    at=st.integers(0, 2**62),
    received=st.integers(0, 2**62),
    destinations=st.lists(_TEXT, max_size=5),
    trace_id=st.just("") | st.just("4bf92f3577b34da6a3ce929d0e0e4736") | _TEXT,
)
def test_a_routed_body_is_the_codecs_bytes(
    message_id: str,
    source: str,
    user: str | None,
    anonymous: str | None,
    event: str | None,
    size: int,
    at: int,
    received: int,
    destinations: list[str],
    trace_id: str,
) -> None:
    call = Call(
        CallType.TRACK if event else CallType.IDENTIFY,
        message_id,
        source,
        timestamp=received,
        received_at=received,
        user_id=user if user or anonymous else "u",
        anonymous_id=anonymous,
        event=event,
    )
    expected = CODEC.encode(
        "LogRecord", call_log_record(call, size, at, destinations=destinations, trace_id=trace_id)
    )[CODEC_HEADER:]
    assert routed_log_body(call, size, at, destinations, trace_id) == expected
    assert routed_log_body(call, size, at, destinations, trace_id) == expected  # pieces kept


_RESULT = st.builds(
    UrlResult,
    url=_TEXT,
    status=st.none() | st.integers(100, 599),
    failure=st.none() | st.sampled_from(list(Failure)),
    detail=st.just(""),
    duration=st.floats(0, 100),
    retry_after=st.none(),
    response=_TEXT,
)


@settings(max_examples=200, deadline=None)
@given(
    results=st.lists(_RESULT, min_size=1, max_size=5),
    tier=st.integers(-1, 8),
    earlier=st.lists(st.integers(0, 2**40), max_size=4),
    started=st.floats(1e9, 2e9),
    took=st.floats(0, 10),
    destination=st.text(min_size=1, max_size=20),
)
def test_a_delivered_body_is_the_codecs_bytes(
    results: list[UrlResult],
    tier: int,
    earlier: list[int],
    started: float,
    took: float,
    destination: str,
) -> None:
    before = Delivery(
        "m1",
        destination,
        "web",
        "track",
        b"{}",
        1,
        tier=tier,
        attempts=tuple(Attempt(at, "u", 500, "server_error", 1) for at in earlier),
    )
    finished = started + took
    record = conclusion_log_record(
        before, Outcome.DELIVERED, before, finished, results=results, started=started
    )
    expected = CODEC.encode("LogRecord", record)[CODEC_HEADER:]
    assert delivered_log_body(before, results, started, finished) == expected


@settings(max_examples=200, deadline=None)
@given(
    names=st.tuples(*[st.text(max_size=80) for _ in range(4)]),
    status=st.integers(200, 299),
    tier=st.integers(-1, 8),
    earlier=st.lists(st.integers(0, 2**40), max_size=4),
    started=st.floats(1e9, 2e9),
    took=st.floats(0, 10),
    duration=st.floats(0, 100),
)
def test_a_call_delivered_by_one_webhook_is_the_codecs_bytes(
    names: tuple[str, str, str, str],
    status: int,
    tier: int,
    earlier: list[int],
    started: float,
    took: float,
    duration: float,
) -> None:
    """The common case's own path (pieces that repeat, remembered): a message id of any length
    and the names its pieces remember, long or not ASCII, and each piece's number."""
    message_id, source, destination, url = names
    before = Delivery(
        message_id,
        destination,
        source,
        "page",
        b"{}",
        1,
        tier=tier,
        attempts=tuple(Attempt(at, "u", 500, "server_error", 1) for at in earlier),
    )
    results = [UrlResult(url, status, None, "", duration, None, "")]
    finished = started + took
    record = conclusion_log_record(
        before, Outcome.DELIVERED, before, finished, results=results, started=started
    )
    expected = CODEC.encode("LogRecord", record)[CODEC_HEADER:]
    assert delivered_log_body(before, results, started, finished) == expected
    assert delivered_log_body(before, results, started, finished) == expected  # remembered


def test_bodies_and_dicts_share_a_batch() -> None:
    call = Call(CallType.TRACK, "m9", "web", timestamp=1, received_at=1, user_id="u", event="E")
    body = routed_log_body(call, 10, 2, ["d"])
    ((_, _, value),) = log_batch_records(CODEC, "t.log", [record("m1"), body])
    assert decode_log_records(CODEC, value) == [
        record("m1"),
        call_log_record(call, 10, 2, destinations=["d"]),
    ]


# ---- read back by the log-store, straight from the bytes -----------------------------------------

_INT = st.integers(-(2**31), 2**31 - 1)
_LONG = st.integers(-(2**63), 2**63 - 1)
# Past 63 bytes a string's length takes two varint bytes; non-ASCII text takes several bytes a
# character.
_ANY_TEXT = st.text(max_size=80) | st.sampled_from(["", "x" * 64, "é" * 40, "<img src=x>"])
_ENTRY = st.builds(
    lambda kind, at, fields: entry(kind, at, **fields),
    st.sampled_from(list(LogKind)),
    _LONG,
    st.fixed_dictionaries(
        {},
        optional={
            "destination": _ANY_TEXT,
            "destinations": st.lists(_ANY_TEXT, max_size=4),
            "reason": _ANY_TEXT,
            "size": _INT,
            "url": _ANY_TEXT,
            "status": st.none() | _INT,
            "error": _ANY_TEXT,
            "durationMs": _INT,
            "tier": _INT,
            "notBefore": _LONG,
            "attempt": _INT,
            "response": _ANY_TEXT,
            "replayId": _ANY_TEXT,
            "body": st.none() | _ANY_TEXT,
            "traceId": _ANY_TEXT,
        },
    ),
)
_RECORD = st.builds(
    lambda message_id, source, call_type, entries, ids: log_record(
        message_id, source, call_type, entries, **ids
    ),
    _ANY_TEXT,
    _ANY_TEXT,
    _ANY_TEXT,
    st.lists(_ENTRY, max_size=4),
    st.fixed_dictionaries(
        {},
        optional={"user_id": _OPTIONAL, "anonymous_id": _OPTIONAL, "event": _OPTIONAL},
    ),
)


def typed(value: bytes) -> list[Any]:
    """What the log-store made of a ``LogBatch`` before ``read_log_batch``: the codec's dicts,
    converted."""
    return [log_record_from_avro(r) for r in decode_log_records(CODEC, value)]


@settings(max_examples=300, deadline=None)
@given(records=st.lists(_RECORD, max_size=5))
def test_a_batch_read_from_its_bytes_is_what_the_codec_reads(records: list[Any]) -> None:
    value = CODEC.encode("LogBatch", log_batch(records))
    assert read_log_batch(CODEC, value) == typed(value)


@settings(max_examples=100, deadline=None)
@given(results=st.lists(_RESULT, min_size=1, max_size=3), destinations=st.lists(_TEXT, max_size=3))
def test_the_hot_bodies_read_back_as_the_codec_reads_them(
    results: list[UrlResult], destinations: list[str]
) -> None:
    call = Call(CallType.TRACK, "m1", "web", timestamp=5, received_at=5, user_id="u", event="E")
    before = Delivery("m1", "d", "web", "track", b"{}", 1)
    bodies = [
        routed_log_body(call, 10, 6, destinations),
        routed_log_body(call, 10, 6, destinations, "4bf92f3577b34da6a3ce929d0e0e4736"),
        delivered_log_body(before, results, 7.0, 7.5),
    ]
    ((_, _, value),) = log_batch_records(CODEC, "t.log", bodies)
    read = read_log_batch(CODEC, value)
    assert read == typed(value)
    requested = sum(result.failure is not Failure.CIRCUIT_OPEN for result in results)
    assert read is not None and [len(r.entries) for r in read] == [2, 2, requested + 1]
    assert read[1].entries[0].trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_blocks_with_a_negative_count_are_read() -> None:
    """Avro lets a writer give an array block a negative count followed by the block's size in
    bytes (fastavro does not write them; others may)."""
    body = CODEC.encode("LogRecord", record("m1"))[CODEC_HEADER:]
    value = CODEC.header("LogBatch") + b"\x01" + bytes([len(body) * 2]) + body + b"\x00"
    assert read_log_batch(CODEC, value) == typed(value) != []


def test_what_it_does_not_read_is_left_to_the_codec() -> None:
    value = CODEC.encode("LogBatch", log_batch([record("m1")]))
    unknown = CODEC.encode(
        "LogBatch",
        log_batch(
            [log_record("m2", "web", "track", [{**entry(LogKind.ROUTED, 1), "kind": "teleported"}])]
        ),
    )
    lone = CODEC.encode("LogRecord", record("m1"))
    for other in (
        None,
        b"junk",
        lone,  # an older writer's lone LogRecord
        value[:-1],  # cut short
        value + b"\x00",  # more than the batch
        unknown,  # a newer writer's entry kind: the dict way skips that record alone
        value.replace(b"\x04m1", b"\x04\xff1"),  # not UTF-8
    ):
        assert read_log_batch(CODEC, other) is None, other
    registry = RegistryCodec.__new__(RegistryCodec)  # its own wire format: always the dict way
    assert read_log_batch(registry, value) is None
