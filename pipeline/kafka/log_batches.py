"""The delivery log on Kafka: ``LogRecord``s travel in ``LogBatch``es, one Kafka record a batch.

A record on ``deliveries.log`` per call and per attempt made the log cost the pipeline a quarter of
its rate (measured, docs/decisions.md): the broker, librdkafka and the acknowledgement each did
per-record work twice over per delivered call. So every writer batches:

- the router puts a part's records (one consumed batch, one input partition) in the part's
  produce or transaction (``log_batch_records``);
- the delivery handler's attempts end one by one, in their own tasks: ``LogBatcher`` gathers the
  log records of every hand-off made in one turn of the event loop into one produce, and
  finishes their Kafka records once it is acknowledged;
- a DLQ replay puts its ``replayed`` records in its transaction.

Readers take both a ``LogBatch`` and a lone ``LogRecord`` (``decode_log_records``), which is
what the log held before batches.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from pipeline.core.exceptions import BrokerUnavailable, UndecodableRecord
from pipeline.core.log_entries import LOG_BATCH_BYTES, log_batch
from pipeline.kafka.codec import RecordCodec
from pipeline.kafka.errors import Outgoing
from pipeline.kafka.producer import AsyncProducer

__all__ = ["LogBatcher", "decode_log_records", "log_batch_records"]
log = logging.getLogger("pipeline.log")

Record = dict[str, Any]


def log_batch_records(
    codec: RecordCodec, topic: str, records: list[Record], key: bytes | None = None
) -> list[Outgoing]:
    """``records`` (``LogRecord`` dicts) as the Kafka records to produce: one ``LogBatch``, cut
    in halves while larger than ``LOG_BATCH_BYTES`` (a lone record goes whatever its size)."""
    value = codec.encode("LogBatch", log_batch(records))
    if len(value) <= LOG_BATCH_BYTES or len(records) == 1:
        return [(topic, key, value)]
    half = len(records) // 2
    return log_batch_records(codec, topic, records[:half], key) + log_batch_records(
        codec, topic, records[half:], key
    )


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


class LogBatcher:
    """One produce for the log records added in one turn of the event loop.

    The batch goes out on the next turn, after every task woken in this one has added its
    record. Once Kafka acknowledged it, each record's ``then(arg)`` is called (the delivery
    handler finishes the Kafka record the log record is about): one wake-up for the batch, not a
    future and a task step per record. If ``stop`` comes first, ``then`` is not called: the
    records are read again after a restart."""

    def __init__(
        self, producer: AsyncProducer, codec: RecordCodec, topic: str, stop: asyncio.Event
    ) -> None:
        self._producer = producer
        self._codec = codec
        self._topic = topic
        self._stop = stop
        self._pending: list[Record] = []
        self._then: list[tuple[Callable[[Any], object], Any]] = []
        self._sending: set[asyncio.Task[None]] = set()

    def add(self, record: Record, then: Callable[[Any], object], arg: Any) -> None:
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
        self, records: list[Record], then: list[tuple[Callable[[Any], object], Any]]
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
