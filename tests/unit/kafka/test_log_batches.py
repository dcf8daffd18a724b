"""The delivery log's Kafka records: ``LogBatch``es (cut in pieces when large), read back with the
lone ``LogRecord``s of older writers, and ``LogBatcher``'s one produce per event-loop turn."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pipeline.core.exceptions import BrokerUnavailable, UndecodableRecord
from pipeline.core.log_entries import LOG_BATCH_BYTES, LogKind, entry, log_record
from pipeline.kafka.codec import Codec
from pipeline.kafka.log_batches import LogBatcher, decode_log_records, log_batch_records

CODEC = Codec.default()


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
