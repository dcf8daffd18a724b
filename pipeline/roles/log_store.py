"""The log-store role: ``deliveries.log`` → the delivery log's store (``pipeline.store``).

Records are decoded on the event loop (``read_log_batch``, or ``decode_log_records`` for what it
does not read) and written by one thread, in the order they were consumed;
while one write runs, the next batches gather and go in the following one (one database
transaction, however many batches). A record is finished once its write committed, so the consumer
group's offsets never pass what the store holds.

The store is idempotent on its own: it keeps, in the same transaction as the rows, the next offset
of every partition it wrote, and skips what is below it. A log-store killed between its write and
its offset commit reads those records again and writes nothing twice.

The consumer group is ``<prefix>log-store.<store id>``; the store id is made with the store, so a
new or rebuilt store (``pipeline log-store --rebuild``) reads the topic from its beginning.

Delivery never waits for any of this: the log-store is its own consumer group. While the store is
down, writes are retried with backoff and the group stops consuming at its in-flight limit; it
catches up from the topic when the store is back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pipeline.core.exceptions import UndecodableRecord
from pipeline.core.log_entries import LogRecord, log_record_from_avro
from pipeline.core.settings import Settings, default_log_store_url
from pipeline.core.topics import Topics
from pipeline.kafka.codec import RecordCodec
from pipeline.kafka.consumer_loop import GATHER, ConsumedRecord, ConsumerLoop
from pipeline.kafka.log_reading import decode_log_records, read_log_batch
from pipeline.runtime import metrics
from pipeline.store import LogStore, StoreUnavailable, masked_url, open_store

__all__ = ["LogStoreHandler", "run_log_store", "empty_store", "EXPIRE_EVERY"]

log = logging.getLogger("pipeline.log_store")

#: How often rows older than ``PIPELINE_LOG_RETENTION`` are deleted.
EXPIRE_EVERY = 300.0
#: Kafka records of the log held unwritten at most (a write takes several batches at once); each
#: is a ``LogBatch`` of up to a consumed batch's calls, or of one turn's attempts.
MAX_IN_FLIGHT = 500


#: One Kafka record of the log, (partition, offset), and its log records as the store writes them.
Rows = tuple[tuple[int, int], list[tuple[int, int, LogRecord]]]


class LogStoreHandler:
    role = "log-store"

    def __init__(
        self,
        store: LogStore,
        *,
        topics: Topics,
        codec: RecordCodec,
        stop: asyncio.Event,
        retention: float,
        thread: ThreadPoolExecutor,
    ) -> None:
        """``thread``: the one thread the store is used from (it was opened there: SQLite
        connections belong to their thread)."""
        self._store = store
        self._topics = topics
        self._codec = codec
        self._stop = stop
        self._retention = retention
        self._thread = thread
        self._waiting: list[tuple[list[ConsumedRecord], list[Rows]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._next_expiry = 0.0
        self._written = metrics.LOG_STORE_WRITTEN
        self._undecodable = metrics.LOG_STORE_UNDECODABLE

    def topics(self) -> Sequence[str]:
        return [self._topics.log]

    async def handle(self, batch: list[ConsumedRecord], loop: ConsumerLoop) -> None:
        rows: list[Rows] = []
        for taken in batch:
            partition, offset = taken.key[1], taken.offset
            value = taken.message.value()
            fast = read_log_batch(self._codec, value)
            if fast is not None:
                rows.append(((partition, offset), [(partition, offset, r) for r in fast]))
                continue
            try:
                records = decode_log_records(self._codec, value)
            except UndecodableRecord as exc:
                self._skip(taken, exc)
                continue
            typed = []
            for record in records:
                try:
                    typed.append((partition, offset, log_record_from_avro(record)))
                except (KeyError, ValueError) as exc:
                    self._skip(taken, exc)
            rows.append(((partition, offset), typed))
        self._waiting.append((batch, rows))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_waiting(loop))

    def _skip(self, taken: ConsumedRecord, exc: Exception) -> None:
        """Not ours or from a newer version: skipped (the topic keeps it), and counted."""
        self._undecodable.inc()
        log.warning("log-store: skipping %s[%d]@%d: %s", *taken.key, taken.offset, exc)

    async def _write_waiting(self, loop: ConsumerLoop) -> None:
        running = asyncio.get_running_loop()
        while self._waiting:
            work, self._waiting = self._waiting, []
            rows: list[tuple[int, int, LogRecord]] = []
            seen: set[tuple[int, int]] = set()
            for _, kafka_records in work:
                for place, typed in kafka_records:
                    if place not in seen:  # a Kafka record read twice is written once
                        seen.add(place)
                        rows += typed
            delay = 0.5
            while True:
                try:
                    written = await running.run_in_executor(self._thread, self._write, rows)
                    break
                except StoreUnavailable as exc:
                    if self._stop.is_set():
                        log.warning("log-store: stopping with %d records unwritten", len(rows))
                        return  # read again after a restart
                    log.warning("log-store: %s; trying again in %.1f s", exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 30.0)
            self._written.inc(written)
            for batch, _ in work:
                for taken in batch:
                    loop.finish(taken)

    def _write(self, rows: list[tuple[int, int, LogRecord]]) -> int:
        """On the store's thread: write, and now and then expire old rows."""
        written = self._store.write(rows) if rows else 0
        now = time.time()
        if now >= self._next_expiry:
            self._next_expiry = now + EXPIRE_EVERY
            expired = self._store.expire(int((now - self._retention) * 1000))
            if expired:
                log.info("log-store: %d rows older than the retention deleted", expired)
        return written

    def assigned(self, keys: Sequence[tuple[str, int]]) -> None:
        return None

    def released(self, keys: Sequence[tuple[str, int]]) -> None:
        return None  # a new owner skips what this one wrote (the store keeps positions)

    async def aclose(self) -> None:
        if self._writer is not None:
            await asyncio.wait([self._writer], timeout=10)


def empty_store(settings: Settings) -> str:
    """Empty the settings' store (a rebuild); it gets a new id, so its consumer group reads the
    log from the start. Returns the store's URL, password masked."""
    url = default_log_store_url(settings)
    with open_store(url) as store:
        store.reset()
    return masked_url(url)


def log_store_group(settings: Settings, store: LogStore) -> str:
    return f"{settings.topic_prefix}log-store.{store.store_id}"


async def open_when_reachable(
    url: str, stop: asyncio.Event, thread: ThreadPoolExecutor
) -> LogStore | None:
    """The store at ``url``, opened on ``thread`` as soon as it can be; ``None`` if ``stop``
    came first."""
    running = asyncio.get_running_loop()
    delay = 1.0
    while not stop.is_set():
        try:
            return await running.run_in_executor(thread, open_store, url)
        except StoreUnavailable as exc:
            log.warning("log-store: %s; trying again in %.0f s", exc, delay)
            try:
                await asyncio.wait_for(stop.wait(), timeout=delay)
            except TimeoutError:
                pass
            delay = min(delay * 2, 30.0)
    return None


async def run_log_store(
    settings: Settings,
    topics: Topics,
    codec: RecordCodec,
    stop: asyncio.Event,
    *,
    started: asyncio.Event | None = None,
    **loop_options: Any,
) -> None:
    """Open the store (waiting for it if it is down), then materialise the log until ``stop``."""
    thread = ThreadPoolExecutor(1, thread_name_prefix="log-store")
    url = default_log_store_url(settings)
    store = await open_when_reachable(url, stop, thread)
    if store is None:
        thread.shutdown()
        return
    running = asyncio.get_running_loop()
    try:
        handler = LogStoreHandler(
            store,
            topics=topics,
            codec=codec,
            stop=stop,
            retention=settings.log_retention,
            thread=thread,
        )
        loop = ConsumerLoop(
            settings,
            log_store_group(settings, store),
            handler,
            max_in_flight=MAX_IN_FLIGHT,
            gather=GATHER,
            **loop_options,
        )
        log.info("log-store: writing %s to %s", topics.log, masked_url(url))
        if started is not None:
            started.set()
        await loop.run(stop)
    finally:
        await running.run_in_executor(thread, store.close)
        thread.shutdown()
