"""An asyncio face on one confluent-kafka producer, shared by every role of a process.

A background thread polls the producer, so delivery reports arrive without the event loop ever
blocking on Kafka. ``send_all`` resolves when Kafka acknowledged a whole batch (one counter per
batch, not one future per record).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, Producer

from ._exceptions import BrokerUnavailable
from ._kafka import make_producer
from ._settings import Settings

__all__ = ["AsyncProducer", "Outgoing", "FATAL_PRODUCER_CODES", "FATAL_PRODUCER_ERRORS"]

#: (topic, key, value)
Outgoing = tuple[str, bytes | None, bytes | None]

#: After these an idempotent producer never recovers: it must be replaced by a new one.
FATAL_PRODUCER_CODES = frozenset(
    {
        KafkaError.PRODUCER_FENCED,
        KafkaError._FATAL,
        KafkaError._FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError.UNKNOWN_PRODUCER_ID,
        KafkaError.INVALID_PRODUCER_ID_MAPPING,
    }
)
#: The same errors as ``send_all`` reports them (their text).
FATAL_PRODUCER_ERRORS = frozenset(KafkaError(code).str() for code in FATAL_PRODUCER_CODES)


class _BatchAcks:
    """Counts the acknowledgements of one batch; resolves its future on the last one."""

    __slots__ = ("loop", "future", "remaining", "failed")

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int) -> None:
        self.loop = loop
        self.future: asyncio.Future[list[tuple[Outgoing, str]]] = loop.create_future()
        self.remaining = count
        self.failed: list[tuple[Outgoing, str]] = []

    def __call__(self, error: KafkaError | None, message: Any) -> None:  # producer poll thread
        if error is not None:
            self.failed.append(((message.topic(), message.key(), message.value()), error.str()))
        self.remaining -= 1
        if self.remaining == 0:
            self.loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        if not self.future.done():
            self.future.set_result(self.failed)


class AsyncProducer:
    def __init__(self, settings: Settings, *, producer: Producer | None = None) -> None:
        self._producer = producer or make_producer(settings)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="producer-poll", daemon=True)
        self._thread.start()

    @property
    def raw(self) -> Producer:
        return self._producer

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    async def send_all(self, records: Sequence[Outgoing]) -> list[tuple[Outgoing, str]]:
        """Produce every record; return the ones Kafka refused, with the error, once all answered."""
        if not records:
            return []
        acks = _BatchAcks(asyncio.get_running_loop(), len(records))
        produce = self._producer.produce
        for topic, key, value in records:  # a plain loop: no coroutine per record
            while True:
                try:
                    produce(topic, value, key, on_delivery=acks)
                    break
                except BufferError:  # local queue full: wait for the poll thread to drain it
                    await asyncio.sleep(0.01)
        return await acks.future

    async def send_all_until_acked(
        self, records: Sequence[Outgoing], stop: asyncio.Event | None = None
    ) -> None:
        """Produce every record, re-sending refused ones with backoff until Kafka has them all.

        Raises ``BrokerUnavailable`` only if ``stop`` is set while some are still unacknowledged.
        """
        pending = list(records)
        delay = 0.1
        while pending:
            failed = await self.send_all(pending)
            if not failed:
                return
            if stop is not None and stop.is_set():
                raise BrokerUnavailable(f"{len(failed)} records unacknowledged: {failed[0][1]}")
            pending = [record for record, _ in failed]
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def close(self, timeout: float = 10.0) -> int:
        """Flush what is queued (up to ``timeout``) and stop polling; returns records left."""
        remaining = int(self._producer.flush(timeout))
        self._stop.set()
        self._thread.join(timeout=1)
        return remaining
