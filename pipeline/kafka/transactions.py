"""Consume, produce and commit at once: one transactional producer per input partition.

The router reads ``calls`` and writes delivery records. To hand each call off exactly once it
produces the records *and* commits the consumed offset in one Kafka transaction: killed before the
commit, neither happened (the records are aborted, the calls are read again); after it, both did.
Readers of what it produces use ``isolation.level=read_committed``.

Why a producer per input partition, with the transactional id ``<prefix>router.<topic>.<partition>``,
rather than one per process: the id is what fences. The next owner of a partition initialises the
same id, which ends whatever transaction the previous owner left open and bumps the epoch, so a
zombie (a router that lost the partition but still runs) has every later produce and commit refused
(``Fenced``). A random id per process would leave a killed router's transaction open until
``transaction.timeout.ms`` (read_committed readers stall behind it meanwhile), and fences nothing on
brokers that do not check the group generation in ``TxnOffsetCommit`` (KIP-447), such as the embedded
broker. The cost is a producer (and its connections) per partition a router owns.

Blocking calls: run ``commit`` on a thread, never on the event loop.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from pipeline.core.deadline import Deadline
from pipeline.core.settings import Settings
from pipeline.kafka.clients import producer_config
from pipeline.kafka.errors import Produced, Refusal
from pipeline.kafka.producer import produce_with

__all__ = ["Fenced", "PartitionTransactions", "TransactionFailed", "transactional_id"]


class Fenced(Exception):
    """A newer producer holds this partition's transactional id: its owner is someone else now."""


class TransactionFailed(Exception):
    """The transaction was aborted (or never began): nothing of it was committed. Try again."""


def transactional_id(settings: Settings, topic: str, partition: int) -> str:
    return f"{settings.topic_prefix}router.{topic}.{partition}"


class PartitionTransactions:
    """Hands off what was made of one input partition's records, in transactions.

        transactions = PartitionTransactions(settings, "calls", 3)
        transactions.commit(records, next_offset=1042, group=consumer.consumer_group_metadata())

    ``commit`` either commits ``records`` together with the consumed position, or raises:
    ``TransactionFailed`` (aborted; call again) or ``Fenced`` (stop: the partition moved on).
    """

    def __init__(self, settings: Settings, topic: str, partition: int, *, timeout: float = 30.0):
        self.topic = topic
        self.partition = partition
        self.id = transactional_id(settings, topic, partition)
        self._config = producer_config(settings, **{"transactional.id": self.id, "linger.ms": 2})
        self._timeout = timeout
        self._producer: Producer | None = None
        self._lock = threading.Lock()  # commit and close may come from different threads
        self.fenced = False
        self.closed = False

    def commit(self, records: Sequence[Produced], *, next_offset: int, group: Any) -> None:
        """Produce ``records`` and commit ``next_offset`` of the input partition, atomically."""
        with self._lock:
            if self.fenced or self.closed:
                raise Fenced(f"{self.id}: fenced or closed")
            producer = self._ready_producer()
            try:
                producer.begin_transaction()
                for record in records:
                    self._produce(producer, record)
                offsets = [TopicPartition(self.topic, self.partition, next_offset)]
                producer.send_offsets_to_transaction(offsets, group, self._timeout)
                self._commit(producer)
            except KafkaException as exc:
                self._failed(producer, exc.args[0])

    def prepare(self) -> None:
        """Take the id now (``init_transactions``): a partition's new owner does this before it
        reads the partition's committed offset, which a transaction left open by the last owner
        would hold back (read_committed readers ask for stable offsets)."""
        with self._lock:
            if not (self.fenced or self.closed):
                self._ready_producer()

    def close(self) -> None:
        """Drop the producer (after any transaction in progress on another thread)."""
        with self._lock:
            self.closed = True
            producer, self._producer = self._producer, None
            if producer is not None:
                with contextlib.suppress(Exception):
                    producer.flush(1)

    # ---- with the lock held -------------------------------------------------------------------

    def _ready_producer(self) -> Producer:
        if self._producer is None:
            producer = Producer(dict(self._config))
            try:
                # Ends (aborts) what a previous owner of the id left open, and fences it.
                producer.init_transactions(self._timeout)
            except KafkaException as exc:
                self._stop_if_fenced(exc.args[0])
                raise TransactionFailed(f"{self.id}: init: {exc.args[0].str()}") from None
            self._producer = producer
        return self._producer

    def _produce(self, producer: Producer, record: Produced) -> None:
        while True:
            try:
                if len(record) == 3:
                    producer.produce(record[0], record[2], record[1])
                else:  # a record parked at routing carries its schedule header
                    produce_with(producer.produce, record)
                return
            except BufferError:  # the local queue is full: let it drain
                producer.poll(0.05)

    def _commit(self, producer: Producer) -> None:
        deadline = Deadline.after(self._timeout)
        while True:
            try:
                producer.commit_transaction(deadline.remaining())
                return
            except KafkaException as exc:
                error = exc.args[0]
                # Retriable: the outcome is not known yet; committing again is how to learn it.
                if not error.retriable() or deadline.expired():
                    raise

    def _stop_if_fenced(self, error: KafkaError) -> None:
        """Raise ``Fenced`` if a newer producer holds the id; this one then never produces again."""
        if Refusal.of(error).fenced:
            self.fenced = True
            self._producer = None
            raise Fenced(f"{self.id}: {error.str()}")

    def _failed(self, producer: Producer, error: KafkaError) -> None:
        self._stop_if_fenced(error)
        if error.fatal():  # broken for good, but still ours: a new producer takes the id again
            self._producer = None
            raise TransactionFailed(f"{self.id}: {error.str()} (producer replaced)")
        try:
            producer.abort_transaction(self._timeout)
        except KafkaException as exc:
            self._stop_if_fenced(exc.args[0])
            self._producer = None  # a new producer's init ends whatever is left open
        raise TransactionFailed(f"{self.id}: aborted: {error.str()}")
