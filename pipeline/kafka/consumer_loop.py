"""The one consumer loop every role runs; roles differ only in their handler.

Why it is shaped like this:

- confluent-kafka's consumer blocks, so every call to it (consume, commit, pause, seek, close) runs
  on one dedicated thread; the asyncio loop never blocks on Kafka and keeps many webhook requests in
  flight. Rebalance callbacks run on that thread too, inside ``consume``.
- A handler gets a batch of ``ConsumedRecord`` records and calls ``finish(taken)`` once each record's outcome
  is durable: delivered, or acknowledged by Kafka on a retry tier or the dead-letter topic. Records
  finish out of order; ``PartitionOffsets`` turns that into the highest contiguous finished offset,
  and only that is committed (every ``commit_interval``, 100 ms by default, and at shutdown). A crash
  re-delivers what was in flight plus what finished since the last commit, and never skips anything
  (at-least-once).
- ``commits=False``: the handler commits offsets itself, inside its Kafka transactions (the router);
  the loop then only keeps count of what is in flight.
- Back-pressure: the loop never works on more than ``max_in_flight`` records at once (a batch takes
  at most the room left); once full, it takes more when a tenth of the limit is free again. A
  record whose work is done and whose outcome only waits for Kafka's acknowledgement
  (``concluded``: its request answered, its hand-off or log record produced) leaves that count
  but stays unfinished, uncommitted, until it is durable. Records unfinished, concluded or not,
  never number more than twice the limit. So a slow acknowledgement (25 ms on the embedded broker)
  does not hold a request's place, and a crash repeats at most twice the limit. A
  batch is what the client has fetched when the loop asks, or the first record to come: it does
  not wait to fill up while records wait, unless its handler pays for each batch (``gather``:
  a transaction, a database commit), whose consume waits for a full batch a while.
- On revocation, the records in flight for the revoked partitions get ``revoke_grace`` seconds to
  finish; then their contiguous position is committed and the rest abandoned to the new owner, who
  starts from that position (duplicates possible, loss not).
- ``defer(taken, until)`` (retry tiers) pauses a partition and seeks back to the record, resuming at
  ``until``. We track pauses ourselves: a record arriving for a partition we hold paused means
  librdkafka forgot (e.g. after a rebalance), so the pause and seek are applied again; on resume we
  seek to the deferred record before resuming, so nothing fetched meanwhile is skipped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from pipeline.core.deadline import Deadline
from pipeline.core.offsets import PartitionOffsets
from pipeline.core.settings import Settings
from pipeline.kafka.clients import consumer_config
from pipeline.runtime import metrics

__all__ = ["ConsumerLoop", "Handler", "ConsumedRecord", "Progress", "GATHER"]

log = logging.getLogger("pipeline.consumer")

TP = tuple[str, int]

#: A ``ConsumedRecord``'s state: being worked on, concluded (only Kafka's acknowledgement awaited:
#: out of the in-flight count), finished.
WORKING, CONCLUDED, FINISHED = 0, 1, 2
#: How long one consume waits for a first record when none has been fetched (seconds).
CONSUME_WAIT = 0.1
#: The ``gather`` of a handler whose batches cost more than their records: a Kafka transaction
#: each, or a database commit (the router with transactions, the log store): its consume waits
#: this long for a full batch.
GATHER = 0.1


class _Partition:
    __slots__ = (
        "offsets",
        "generation",
        "concluded",
        "paused_until",
        "resume_offset",
        "resume_handle",
    )

    def __init__(self) -> None:
        self.offsets = PartitionOffsets()
        self.generation = 0
        self.concluded = 0  # records concluded, not finished
        self.paused_until: float | None = None
        self.resume_offset: int | None = None
        self.resume_handle: asyncio.TimerHandle | None = None


class ConsumedRecord:
    """A Kafka record consumed and being worked on; hand it back to ``ConsumerLoop.finish`` once
    its outcome is durable. A record that carries several (``split``) is finished once each of
    them is."""

    __slots__ = (
        "message",
        "key",
        "offset",
        "_partition",
        "_generation",
        "_container",
        "_state",
    )

    def __init__(
        self, message: Message, key: tuple[str, int], offset: int, partition: _Partition
    ) -> None:
        self.message = message
        self.key = key  # (topic, partition), read once from the message
        self.offset = offset
        self._partition = partition
        self._generation = partition.generation
        self._container: _Container | None = None
        self._state = WORKING

    def split(self, messages: Sequence[Any]) -> list[ConsumedRecord]:
        """This record as the several records it carries (``messages``, which answer what a
        consumed message answers): each is finished on its own, and this one once all are."""
        container = _Container(self, len(messages))
        parts = []
        for message in messages:
            part = ConsumedRecord.__new__(ConsumedRecord)
            part.message, part.key, part.offset = message, self.key, self.offset
            part._partition, part._generation = self._partition, self._generation
            part._container = container
            part._state = WORKING
            parts.append(part)
        return parts

    def finished(self) -> ConsumedRecord | None:
        """What finishing this record finishes: itself; one of a split record's parts, the
        record that carried it once it is the last to finish (``None`` before)."""
        container = self._container
        if container is None:
            return self
        container.left -= 1
        return None if container.left else container.record


class _Container:
    """A record split into the records it carries, and how many of them are not finished."""

    __slots__ = ("record", "left")

    def __init__(self, record: ConsumedRecord, left: int) -> None:
        self.record = record
        self.left = left


class Progress(Protocol):
    """What a handler tells the loop of its records (``ConsumerLoop``'s face to handlers)."""

    def finish(self, taken: ConsumedRecord) -> None: ...

    def concluded(self, taken: ConsumedRecord) -> None: ...

    def owns(self, taken: ConsumedRecord) -> bool: ...

    def defer(self, taken: ConsumedRecord, until: float) -> None: ...


class Handler(Protocol):
    role: str

    def topics(self) -> Sequence[str]: ...

    async def handle(self, batch: list[ConsumedRecord], loop: ConsumerLoop) -> None:
        """Start work on ``batch``; call ``loop.finish`` for each record once it is durable."""

    def assigned(self, keys: Sequence[TP]) -> None:
        """The partitions ``keys`` are being assigned (on the consumer thread, before their
        committed offsets are read): prepare for them, blocking if need be."""

    def released(self, keys: Sequence[TP]) -> None:
        """The partitions ``keys`` were revoked or lost: their records are no longer ours."""

    async def aclose(self) -> None: ...


class ConsumerLoop:
    def __init__(
        self,
        settings: Settings,
        group_id: str,
        handler: Handler,
        *,
        max_in_flight: int | None = None,
        batch_size: int = 500,
        commit_interval: float | None = None,
        commits: bool = True,
        gather: float = 0.0,
        revoke_grace: float | None = None,
        consumer_overrides: dict[str, Any] | None = None,
    ) -> None:
        self.handler = handler
        self.group_id = group_id
        self._settings = settings
        self._max_in_flight = max_in_flight or settings.max_in_flight
        self._batch_size = batch_size
        # Full, the loop takes more only once a tenth of the limit (at most a batch) is free:
        # batches of a few records each would cost a consume round trip apiece.
        self._refill_at = self._max_in_flight - min(batch_size, max(1, self._max_in_flight // 10))
        self._commit_interval = commit_interval or settings.commit_interval
        self._commits = commits
        self._gather = gather
        self._revoke_grace = (
            revoke_grace if revoke_grace is not None else settings.delivery_timeout + 2.0
        )
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"{handler.role}-consumer")
        self._partitions: dict[TP, _Partition] = {}
        self._in_flight = 0  # records taken, neither concluded nor finished
        self._concluded = 0  # records concluded, not finished
        self._capacity = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        overrides = {"statistics.interval.ms": 5000, "stats_cb": metrics.record_kafka_stats}
        overrides.update(consumer_overrides or {})
        self._consumer = Consumer(consumer_config(settings, group_id, **overrides))
        self._gauge = metrics.IN_FLIGHT.labels(handler.role)
        self._held: set[TP] = set()
        self._held_gauge = metrics.PARTITIONS_HELD.labels(handler.role)
        self.assigned = asyncio.Event()

    # ---- called by handlers, on the event loop -------------------------------------------------

    def finish(self, taken: ConsumedRecord) -> None:
        if taken._container is not None:  # a part: the record is finished with its last part
            container = taken.finished()
            if container is None:
                return
            taken = container
        partition = taken._partition
        if partition.generation != taken._generation:
            return  # revoked: the new owner consumes the record again
        if self._partitions.get(taken.key) is not partition:
            return
        if taken._state == FINISHED:
            return
        partition.offsets.finish(taken.offset)
        if taken._state == CONCLUDED:
            partition.concluded -= 1
            self._concluded -= 1
        else:
            self._in_flight -= 1
        taken._state = FINISHED
        self._gauge.dec()
        self._room_made()

    def concluded(self, taken: ConsumedRecord) -> None:
        """``taken``'s work is done; its outcome only waits for Kafka's acknowledgement: it no
        longer counts against ``max_in_flight``, and stays uncommitted until ``finish``. (A part
        of a split record counts with the record, until its last part finishes.)"""
        if taken._container is not None or taken._state != WORKING or not self.owns(taken):
            return
        taken._state = CONCLUDED
        taken._partition.concluded += 1
        self._concluded += 1
        self._in_flight -= 1
        self._room_made()

    def _room_made(self) -> None:
        if self._in_flight <= self._refill_at and self._unfinished_room() > 0:
            self._capacity.set()

    def _unfinished_room(self) -> int:
        return 2 * self._max_in_flight - self._in_flight - self._concluded

    def owns(self, taken: ConsumedRecord) -> bool:
        """Whether ``taken``'s partition is still assigned here as it was when it was taken (a
        worker that lost it must not hand the record off: its new owner processes it again)."""
        partition = taken._partition
        return partition.generation == taken._generation and (
            self._partitions.get(taken.key) is partition
        )

    def group_metadata(self) -> Any:
        """The consumer's group metadata, for ``send_offsets_to_transaction``."""
        return self._consumer.consumer_group_metadata()

    def defer(self, taken: ConsumedRecord, until: float) -> None:
        """Do not process ``taken`` (and what follows it in its partition) before ``until``."""
        key, offset = taken.key, taken.offset
        partition = self._partitions.get(key)
        if partition is None or partition is not taken._partition:
            return
        if partition.generation == taken._generation:
            self._forget_from(partition, offset)
        partition.paused_until = until
        partition.resume_offset = offset
        self._run_on_consumer(self._pause_and_seek, key, offset)
        loop = self._require_loop()
        if partition.resume_handle is not None:
            partition.resume_handle.cancel()
        delay = max(0.0, until - time.time())
        partition.resume_handle = loop.call_later(delay, self._resume, key, partition)

    # ---- the loop ---------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._consumer.subscribe(
            list(self.handler.topics()),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        next_commit = Deadline.after(self._commit_interval)
        try:
            while not stop.is_set():
                if self._in_flight > self._refill_at or self._unfinished_room() <= 0:
                    self._capacity.clear()
                    await _wait_any(self._capacity, stop, timeout=self._commit_interval)
                else:
                    # Never more than the room left: the limits bound what a crash repeats.
                    room = min(
                        self._batch_size,
                        self._max_in_flight - self._in_flight,
                        self._unfinished_room(),
                    )
                    messages = await self._on_consumer(self._consume, room)
                    batch = self._take(messages)
                    if batch:
                        await self.handler.handle(batch, self)
                if next_commit.expired():
                    await self._commit(asynchronous=True)
                    next_commit.renew(self._commit_interval)
        finally:
            await self._shutdown()

    def _consume(self, room: int) -> list[Message]:
        """Up to ``room`` records, on the consumer's thread: what the client has fetched, or the
        first record to come (a consume of ``room`` waits until that many came or its timeout
        passed, while the loop has room and records wait). A loop told to ``gather`` waits that
        long for a full batch, as a consume does.

        One consume a call that returns records: a rebalance callback runs inside a consume,
        and records taken by an earlier one, not yet tracked, would escape the revocation."""
        consume = self._consumer.consume
        if self._gather:
            return consume(room, self._gather)
        return consume(room, 0) or consume(1, CONSUME_WAIT)

    def _take(self, messages: list[Message]) -> list[ConsumedRecord]:
        batch: list[ConsumedRecord] = []
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("%s: consume error: %s", self.handler.role, error.str())
                continue
            topic, partition_id, offset = message.topic(), message.partition(), message.offset()
            # A consumed record always has all three; the client's types say "or None".
            assert topic is not None and partition_id is not None and offset is not None
            key = (topic, partition_id)
            partition = self._partitions.get(key)
            if partition is None:
                partition = self._partitions[key] = _Partition()
            if partition.paused_until is not None:
                # librdkafka forgot our pause (it does across rebalances): apply it again.
                assert partition.resume_offset is not None
                if offset >= partition.resume_offset:
                    self._run_on_consumer(self._pause_and_seek, key, partition.resume_offset)
                    continue
            partition.offsets.add(offset)
            batch.append(ConsumedRecord(message, key, offset, partition))
        if batch:
            self._in_flight += len(batch)
            self._gauge.inc(len(batch))
        return batch

    def _forget_from(self, partition: _Partition, offset: int) -> None:
        before = len(partition.offsets)
        partition.offsets.forget_from(offset)
        dropped = before - len(partition.offsets)
        # No new generation: records below ``offset`` may still be in flight, and they must still
        # finish (or the partition's commit position and the in-flight count stall for good).
        # Records at and after it were never started; they are taken again after the seek.
        self._in_flight -= dropped
        self._gauge.dec(dropped)
        self._room_made()

    def _resume(self, key: TP, partition: _Partition) -> None:
        if self._partitions.get(key) is not partition or partition.resume_offset is None:
            return
        offset = partition.resume_offset
        partition.paused_until = None
        partition.resume_offset = None
        partition.resume_handle = None
        self._run_on_consumer(self._seek_and_resume, key, offset)

    # ---- consumer thread --------------------------------------------------------------------------

    def _pause_and_seek(self, key: TP, offset: int) -> None:
        try:
            self._consumer.pause([TopicPartition(*key)])
            self._consumer.seek(TopicPartition(key[0], key[1], offset))
        except Exception as exc:  # the partition may have been revoked meanwhile
            log.debug("pause %s: %s", key, exc)

    def _seek_and_resume(self, key: TP, offset: int) -> None:
        try:
            self._consumer.seek(TopicPartition(key[0], key[1], offset))
            self._consumer.resume([TopicPartition(*key)])
        except Exception as exc:
            log.debug("resume %s: %s", key, exc)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info(
            "%s: assigned %s",
            self.handler.role,
            ", ".join(f"{p.topic}[{p.partition}]" for p in partitions),
        )
        keys = [(p.topic, p.partition) for p in partitions]
        self._held.update(keys)
        self._held_gauge.set(len(self._held))
        self.handler.assigned(keys)
        loop = self._require_loop()
        loop.call_soon_threadsafe(self.assigned.set)
        # Partitions we still hold paused (kept across a cooperative rebalance): pause again.
        held = [
            TopicPartition(key[0], key[1])
            for key, part in list(self._partitions.items())
            if part.paused_until is not None
        ]
        if held:
            consumer.pause(held)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [(p.topic, p.partition) for p in partitions]
        loop = self._require_loop()
        future = asyncio.run_coroutine_threadsafe(self._release(keys, drain=True), loop)
        try:
            offsets = future.result(timeout=self._revoke_grace + 5)
        except Exception:
            log.exception("%s: could not release revoked partitions", self.handler.role)
            return
        if offsets and self._commits:
            try:
                consumer.commit(offsets=offsets, asynchronous=False)
            except Exception as exc:
                log.warning("%s: commit on revoke failed: %s", self.handler.role, exc)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [(p.topic, p.partition) for p in partitions]
        log.warning(
            "%s: lost %s (the group moved on without us); their records are left to the new owner",
            self.handler.role,
            ", ".join(f"{topic}[{number}]" for topic, number in keys),
        )
        loop = self._require_loop()
        asyncio.run_coroutine_threadsafe(self._release(keys, drain=False), loop).result(timeout=5)

    # ---- shared -----------------------------------------------------------------------------------

    async def _release(self, keys: list[TP], *, drain: bool) -> list[TopicPartition]:
        """Stop tracking ``keys``: wait for their in-flight records, return what to commit."""
        if drain:
            deadline = Deadline.after(self._revoke_grace)
            while not deadline.expired() and any(
                len(self._partitions[k].offsets) for k in keys if k in self._partitions
            ):
                await asyncio.sleep(0.02)
        offsets = []
        for key in keys:
            partition = self._partitions.pop(key, None)
            if partition is None:
                continue
            if partition.resume_handle is not None:
                partition.resume_handle.cancel()
            position = partition.offsets.position()
            if drain and position is not None:
                offsets.append(TopicPartition(key[0], key[1], position))
            unfinished = len(partition.offsets)
            partition.generation += 1
            self._in_flight -= unfinished - partition.concluded
            self._concluded -= partition.concluded
            partition.concluded = 0
            self._gauge.dec(unfinished)
        self._room_made()
        self._held.difference_update(keys)
        self._held_gauge.set(len(self._held))
        self.handler.released(keys)
        return offsets

    async def _commit(self, *, asynchronous: bool) -> None:
        if not self._commits:
            return
        offsets = []
        for (topic, number), partition in self._partitions.items():
            position = partition.offsets.position()
            if position is not None:
                offsets.append(TopicPartition(topic, number, position))
                partition.offsets.committed(position)
        if offsets:
            try:
                await self._on_consumer(
                    self._consumer.commit, offsets=offsets, asynchronous=asynchronous
                )
            except Exception as exc:  # a later commit carries the same positions
                log.warning("%s: commit failed: %s", self.handler.role, exc)

    async def _shutdown(self) -> None:
        deadline = Deadline.after(self._revoke_grace)
        while (self._in_flight or self._concluded) and not deadline.expired():
            await asyncio.sleep(0.02)
        if self._in_flight or self._concluded:
            log.warning(
                "%s: %d records unfinished at shutdown; they will be processed again",
                self.handler.role,
                self._in_flight + self._concluded,
            )
        await self._commit(asynchronous=False)
        await self.handler.aclose()
        await self._on_consumer(self._consumer.close)
        self._executor.shutdown(wait=True)

    async def _on_consumer(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = self._require_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    def _run_on_consumer(self, fn: Any, *args: Any) -> None:
        self._executor.submit(fn, *args)

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "ConsumerLoop.run() has not started"
        return self._loop


async def _wait_any(first: asyncio.Event, second: asyncio.Event, *, timeout: float) -> None:
    waiters = [asyncio.ensure_future(first.wait()), asyncio.ensure_future(second.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
