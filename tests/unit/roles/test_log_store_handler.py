"""``LogStoreHandler`` driven without a broker, over a real SQLite store in the test's directory:
records are finished only once written, an unreadable record is skipped and counted, a store that
is down is waited for, and the same records consumed twice are written once."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pipeline.core.log_entries import LogKind, entry, log_batch, log_record
from pipeline.core.timestamps import now_ms
from pipeline.core.topics import Topics
from pipeline.kafka.codec import Codec
from pipeline.roles.log_store import LogStoreHandler
from pipeline.runtime import metrics
from pipeline.store import LogQuery, StoreUnavailable, open_store
from tests.unit.roles._fakes import FakeLoop, taken

TOPICS = Topics("t.")
CODEC = Codec.default()


def routed(message_id: str, at: int | None = None) -> bytes:
    """A lone LogRecord, as writers before batches produced it."""
    return CODEC.encode("LogRecord", routed_record(message_id, at))


def batch_of(*message_ids: str) -> bytes:
    """A LogBatch, as the pipeline produces it now."""
    return CODEC.encode("LogBatch", log_batch([routed_record(m) for m in message_ids]))


def routed_record(message_id: str, at: int | None = None) -> dict[str, Any]:
    at = now_ms() if at is None else at
    return log_record(
        message_id,
        "web",
        "track",
        [entry(LogKind.RECEIVED, at, size=10), entry(LogKind.ROUTED, at, destinations=["d"])],
        user_id="u1",
        event="Order",
    )


class FlakyStore:
    """A store whose first ``failures`` writes find it down."""

    def __init__(self, store: Any, failures: int) -> None:
        self.store, self.failures, self.tries = store, failures, 0

    def write(self, rows: Any) -> int:
        self.tries += 1
        if self.tries <= self.failures:
            raise StoreUnavailable("sqlite:///x", "down for the test")
        return int(self.store.write(rows))

    def expire(self, before_ms: int) -> int:
        return int(self.store.expire(before_ms))


def drive(store: Any, batches: list[list[Any]]) -> FakeLoop:
    loop = FakeLoop()

    async def go() -> None:
        thread = ThreadPoolExecutor(1)
        handler = LogStoreHandler(
            store,
            topics=TOPICS,
            codec=CODEC,
            stop=asyncio.Event(),
            retention=7 * 86400,
            thread=thread,
        )
        for batch in batches:
            await handler.handle(batch, loop)
        await handler.aclose()
        thread.shutdown()

    asyncio.run(go())
    return loop


def test_records_are_written_then_finished_and_a_second_reading_writes_nothing(
    tmp_path: Path,
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'log.sqlite3'}")
    batch = [taken(TOPICS.log, routed(f"m{i}"), partition=i % 2, offset=i // 2) for i in range(6)]
    loop = drive(store, [batch[:4], batch[4:]])
    assert loop.finished == batch
    assert len(store.log(LogQuery())) == 6
    assert store.positions() == {0: 3, 1: 3}
    again = drive(store, [batch])  # consumed again (a restart before the Kafka commit)
    assert again.finished == batch and len(store.log(LogQuery())) == 6
    assert len(store.trace("m0").entries) == 2  # received and routed, once
    store.close()


def test_every_record_of_a_batch_is_written_once_however_often_it_is_read(
    tmp_path: Path,
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'log.sqlite3'}")
    first = taken(TOPICS.log, batch_of("m1", "m2", "m3"), offset=0)
    second = taken(TOPICS.log, batch_of("m4"), offset=1)
    loop = drive(store, [[first], [first, second], [second]])  # read again, as after a rebalance
    assert loop.finished == [first, first, second, second]
    assert sorted(row.message_id for row in store.log(LogQuery())) == ["m1", "m2", "m3", "m4"]
    assert all(len(store.trace(m).entries) == 2 for m in ("m1", "m2", "m3", "m4"))
    assert store.positions() == {0: 2}
    store.close()


def test_an_unreadable_record_is_skipped_counted_and_finished(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'log.sqlite3'}")
    before = metrics.LOG_STORE_UNDECODABLE._value.get()
    batch = [taken(TOPICS.log, b"junk", offset=0), taken(TOPICS.log, routed("m1"), offset=1)]
    loop = drive(store, [batch])
    assert loop.finished == batch
    assert metrics.LOG_STORE_UNDECODABLE._value.get() == before + 1
    assert [row.message_id for row in store.log(LogQuery())] == ["m1"]
    store.close()


def test_rows_older_than_the_retention_are_expired(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'log.sqlite3'}")
    old = now_ms() - 8 * 86400 * 1000
    batch = [
        taken(TOPICS.log, routed("old", at=old), offset=0),
        taken(TOPICS.log, routed("new"), offset=1),
    ]
    drive(store, [batch])
    assert [row.message_id for row in store.log(LogQuery())] == ["new"]
    store.close()


def test_a_store_that_is_down_is_waited_for_and_nothing_is_finished_before(
    tmp_path: Path,
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'log.sqlite3'}")
    flaky = FlakyStore(store, failures=2)
    batch = [taken(TOPICS.log, routed("m1"), offset=0)]
    loop = drive(flaky, [batch])
    assert flaky.tries == 3 and loop.finished == batch
    assert store.trace("m1") is not None
    store.close()
