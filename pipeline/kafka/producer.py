"""Producing and knowing it landed: the one way every part of the pipeline writes to Kafka.

Two faces over confluent-kafka's producer, sharing one acknowledgement counter (``Acks``):

``AsyncProducer``
    For the event loop (router, deliver, ingestion API, the async client). A delivery report
    runs a Python callback, which a background thread polling the producer serves at once but
    takes the GIL from the loop for: with thousands of records a second, those hand-overs cost
    the loop a tenth of its CPU. So while a send waits, the loop serves the answers itself
    (``poll(0)`` every ``SERVE_EVERY``). The thread serves them too while fewer than
    ``THREAD_SERVES_BELOW`` records wait (a request waiting for one call is not kept waiting
    for the next serving), and librdkafka's errors and logs when nothing waits. The loop never
    blocks on Kafka. ``send_all`` resolves when Kafka answered for a whole batch (one counter
    per batch, not one future per record) with the records it refused.

``AckedProducer``
    For commands and threads (``config apply``, ``send``, deletion requests, audience syncs, DLQ
    replays, the sync client): ``produce`` as often as needed, then ``flush``, which raises
    ``BrokerUnavailable`` when acknowledgements are missing. ``transaction()`` makes everything
    produced inside it visible together or not at all.

Refusals keep librdkafka's error code (``Refusal``), so callers decide by code, not by text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from confluent_kafka import KafkaError, Producer

from pipeline.core.deadline import Deadline
from pipeline.core.exceptions import BrokerUnavailable
from pipeline.core.settings import Settings
from pipeline.kafka.clients import make_producer, producer_config
from pipeline.kafka.errors import Failed, Headed, Headers, Outgoing, Placed, Produced, Refusal

__all__ = [
    "Acks",
    "AsyncProducer",
    "AckedProducer",
    "Producing",
    "Ends",
    "Outgoing",
    "Failed",
    "FLUSH_TIMEOUT",
]

log = logging.getLogger("pipeline.kafka")

#: How long ``AckedProducer`` waits for the last acknowledgements, and for room in its queue.
FLUSH_TIMEOUT = 60.0
#: How often the event loop serves Kafka's answers while a send waits for them (seconds).
SERVE_EVERY = 0.001
#: The background thread serves answers too while fewer records than this wait for theirs.
THREAD_SERVES_BELOW = 100
#: How long the background thread waits in one poll, or for the loop to serve less (seconds).
IDLE_POLL = 0.05


def produce_with(produce: Any, record: Headed | Placed, **extra: Any) -> None:
    """Produce a record with headers, and to its own partition if it names one."""
    headers = record[3] or None
    if len(record) == 5:
        produce(record[0], record[2], record[1], headers=headers, partition=record[4], **extra)
    else:
        produce(record[0], record[2], record[1], headers=headers, **extra)


class Producing(Protocol):
    """What the event loop's writers ask of ``AsyncProducer``."""

    async def send_all(self, records: Sequence[Produced]) -> list[Failed]: ...

    async def send_all_until_acked(
        self, records: Sequence[Produced], stop: asyncio.Event | None = None, *, ends: Ends = None
    ) -> None: ...


class Acks:
    """Counts Kafka's answers for produced records (librdkafka calls it as ``on_delivery``,
    from whichever thread polls the producer)."""

    __slots__ = ("answered", "failed")

    def __init__(self) -> None:
        self.answered = 0
        self.failed: list[Failed] = []

    def __call__(self, error: KafkaError | None, message: Any) -> None:
        if error is not None:
            headers = message.headers()
            record: Produced = (message.topic(), message.key(), message.value())
            partition = message.partition()  # None: refused before it was given one
            if partition is not None and partition >= 0:  # sent again where it was going
                record = (message.topic(), message.key(), message.value(), headers or [], partition)
            elif headers:
                record = (message.topic(), message.key(), message.value(), headers)
            self.failed.append(Failed(record, Refusal.of(error)))
        self.answered += 1

    @property
    def acked(self) -> int:
        return self.answered - len(self.failed)


#: Given to a send: filled with the offset of the last record acknowledged in each (topic,
#: partition) it wrote to.
Ends = dict[tuple[str, int], int] | None


class _BatchAcks(Acks):
    """The acknowledgements of one ``send_all`` batch; resolves its future on the last one."""

    __slots__ = ("loop", "thread", "future", "expected", "ends")

    def __init__(self, loop: asyncio.AbstractEventLoop, expected: int, ends: Ends = None) -> None:
        super().__init__()
        self.loop = loop
        self.thread = threading.get_ident()
        self.future: asyncio.Future[list[Failed]] = loop.create_future()
        self.expected = expected
        self.ends = ends

    def __call__(self, error: KafkaError | None, message: Any) -> None:  # whoever polled
        Acks.__call__(self, error, message)
        if self.ends is not None and error is None:
            where = (message.topic(), message.partition())
            self.ends[where] = max(self.ends.get(where, -1), message.offset())
        if self.answered == self.expected:
            if threading.get_ident() == self.thread:  # served by the loop
                self._resolve()
            else:  # by the idle thread, or a flush
                self.loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        if not self.future.done():
            self.future.set_result(self.failed)


class AsyncProducer:
    def __init__(self, settings: Settings, *, producer: Producer | None = None) -> None:
        self._producer = producer or make_producer(settings)
        #: Records waiting for Kafka's answers; while there are any, their loop serves them.
        self._waiting = 0
        #: The loop serving them now (``None``: none is).
        self._serving_loop: asyncio.AbstractEventLoop | None = None
        self._said = float("-inf")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="producer-poll", daemon=True)
        self._thread.start()

    @property
    def raw(self) -> Producer:
        return self._producer

    def _poll(self) -> None:
        """Serve Kafka's answers and errors while few records wait, until ``close``."""
        while not self._stop.is_set():
            if self._waiting >= THREAD_SERVES_BELOW:  # the loop serves them alone
                self._stop.wait(IDLE_POLL)
            else:
                self._serve_once(IDLE_POLL)

    def _serve_once(self, timeout: float) -> None:
        """One ``poll``. A callback that raises makes ``poll`` raise (confluent-kafka may turn it
        into a ``SystemError``); serving goes on, since every later acknowledgement would be lost
        otherwise, and the worker would wait for them."""
        try:
            self._producer.poll(timeout)
        except Exception:
            if time.monotonic() - self._said > 60.0:
                self._said = time.monotonic()
                log.exception("producer: a delivery callback failed (said once a minute)")

    def _serve(self) -> None:
        """On the loop: serve what Kafka answered, and again in ``SERVE_EVERY`` while a send
        waits."""
        self._serve_once(0)
        loop = self._serving_loop
        if self._waiting and loop is not None and not loop.is_closed():
            loop.call_later(SERVE_EVERY, self._serve)
        else:
            self._serving_loop = None

    def _wait_begins(self, loop: asyncio.AbstractEventLoop, records: int) -> None:
        self._waiting += records
        if self._serving_loop is not loop:  # none serves, or a dead loop did
            self._serving_loop = loop
            loop.call_soon(self._serve)

    async def send_all(self, records: Sequence[Produced], *, ends: Ends = None) -> list[Failed]:
        """Produce every record; return the ones Kafka refused, once all answered (``ends``: see
        ``Ends``)."""
        if not records:
            return []
        loop = asyncio.get_running_loop()
        acks = _BatchAcks(loop, len(records), ends)
        produce = self._producer.produce
        self._wait_begins(loop, len(records))
        try:
            for record in records:  # a plain loop: no coroutine per record
                while True:
                    try:
                        if len(record) == 3:
                            produce(record[0], record[2], record[1], on_delivery=acks)
                        else:
                            produce_with(produce, record, on_delivery=acks)
                        break
                    except BufferError:  # local queue full: wait while answers drain it
                        await asyncio.sleep(0.01)
            return await acks.future
        finally:
            self._waiting -= len(records)

    async def send_all_until_acked(
        self, records: Sequence[Produced], stop: asyncio.Event | None = None, *, ends: Ends = None
    ) -> None:
        """Produce every record, re-sending refused ones with backoff until Kafka has them all
        (``ends``: see ``Ends``).

        Raises ``BrokerUnavailable`` only if ``stop`` is set while some are still unacknowledged.
        """
        pending = list(records)
        delay = 0.1
        while pending:
            failed = await self.send_all(pending, ends=ends)
            if not failed:
                return
            if stop is not None and stop.is_set():
                raise BrokerUnavailable(f"{len(failed)} records unacknowledged: {failed[0]}")
            pending = [record for record, _ in failed]
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def close(self, timeout: float = 10.0) -> int:
        """Flush what is queued (up to ``timeout``) and stop polling; returns records left."""
        remaining = int(self._producer.flush(timeout))
        self._stop.set()
        self._thread.join(timeout=1)
        return remaining


class AckedProducer:
    """A producer for commands and threads: ``flush`` says whether Kafka acknowledged everything.

        producer = AckedProducer(settings)
        producer.produce(topic, key, value, partition=3)
        producer.flush()        # raises BrokerUnavailable if acknowledgements are missing
        producer.failed         # what Kafka refused: [Failed(record, Refusal(code, text))]

    ``transactional=True`` gives it a transactional id; then ``with producer.transaction():``
    commits what was produced inside it, or aborts it all on an exception.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        buffer_timeout: float = FLUSH_TIMEOUT,
        transactional: bool = False,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        overrides = dict(config or {})
        if transactional:
            overrides["transactional.id"] = f"{settings.topic_prefix}pipeline-{uuid.uuid4()}"
        self._config = producer_config(settings, **overrides)
        self._producer = Producer(dict(self._config))
        self._buffer_timeout = buffer_timeout
        self._transactions_ready = False
        self._produced = 0
        self.acks = Acks()

    @property
    def failed(self) -> list[Failed]:
        return self.acks.failed

    @property
    def acked(self) -> int:
        return self.acks.acked

    def reset_counts(self) -> None:
        """Count from zero again (one producer, several steps each checked on its own)."""
        self.acks = Acks()

    def replace(self) -> None:
        """A new producer in place of one Kafka fenced (its records' refusals were ``fatal``)."""
        self._producer = Producer(dict(self._config))
        self._transactions_ready = False

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        *,
        partition: int | None = None,
        headers: Headers = (),
    ) -> None:
        extra: dict[str, Any] = {} if partition is None else {"partition": partition}
        if headers:
            extra["headers"] = list(headers)
        deadline: Deadline | None = None
        while True:
            try:
                self._producer.produce(topic, value, key, on_delivery=self.acks, **extra)
                break
            except BufferError:  # the local queue is full: let it drain
                deadline = deadline or Deadline.after(self._buffer_timeout)
                if deadline.expired():
                    raise BrokerUnavailable(
                        f"Kafka accepted nothing for {self._buffer_timeout:.0f} s "
                        "(local producer queue full)"
                    ) from None
                self._producer.poll(0.05)
        self._produced += 1
        if self._produced % 1000 == 0:  # serve delivery reports now and then, not every time
            self._producer.poll(0)

    def flush(self, timeout: float = FLUSH_TIMEOUT) -> None:
        remaining = self._producer.flush(timeout)
        if remaining:
            raise BrokerUnavailable(
                f"{remaining} records were not acknowledged by Kafka within {timeout:.0f} s; "
                "they may or may not have been written"
            )

    @contextlib.contextmanager
    def transaction(self, timeout: float = 30.0, *, what: str = "transaction") -> Iterator[None]:
        """Everything produced inside is committed together, or aborted, and ``BrokerUnavailable``
        raised (``"<what> aborted, nothing was written: ..."``), if anything fails."""
        try:
            if not self._transactions_ready:
                self._producer.init_transactions(timeout)
                self._transactions_ready = True
            self._producer.begin_transaction()
            yield
            self._producer.commit_transaction(timeout)
        except Exception as exc:
            with contextlib.suppress(Exception):  # the original error is the one to report
                self._producer.abort_transaction(5)
            raise BrokerUnavailable(f"{what} aborted, nothing was written: {exc}") from None

    def close(self, timeout: float = 10.0) -> None:
        self._producer.flush(timeout)
