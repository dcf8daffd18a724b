"""Compacted state topics that commands read and write: ``deletion-requests``, ``audience-state``.

A command reads the state it needs, decides, produces, and writes the new state. Three helpers:

``pinned_partition``
    Records of one group (one audience, one user's deletion request) always go to one partition,
    chosen by a stable CRC-32 of the group, so a reader reads that partition only. Compaction
    keeps working because a key always lands in the same partition; do not change the partition
    count of these topics afterwards (the same rule as for any keyed compacted topic).

``read_partition``
    Reads one partition from the beginning to its end, as ``enable.partition.eof`` reports it
    (the embedded broker's high watermark can lag the true end of the log, so it is not used),
    without a consumer group, keeping only keys with a given prefix.

``AckedProducer``
    Produces and then waits until Kafka acknowledged everything, counting refusals: the caller
    moves to its next step only when the previous one is durable.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from ._exceptions import BrokerUnavailable
from ._kafka import consumer_config, make_producer
from ._settings import Settings

__all__ = ["pinned_partition", "partition_count", "read_partition", "AckedProducer"]

log = logging.getLogger("pipeline.state")

#: A read with no message and no end-of-partition for this long means the broker is gone.
READ_IDLE_TIMEOUT = 30.0
#: How long ``flush`` waits for the last acknowledgements.
FLUSH_TIMEOUT = 60.0


def pinned_partition(group: bytes, partitions: int) -> int:
    """The partition of every record of ``group``: stable across processes and machines.

    >>> pinned_partition(b"web/vip", 6)
    1
    """
    return zlib.crc32(group) % partitions


def _consumer(settings: Settings) -> Consumer:
    return Consumer(
        consumer_config(
            settings,
            # Required by librdkafka; never joined (partitions are assigned, offsets not committed).
            group_id=f"{settings.topic_prefix}state-reader",
            # A one-shot read to the end: answer fast at the end instead of waiting for data.
            **{"enable.partition.eof": True, "fetch.queue.backoff.ms": 10, "fetch.wait.max.ms": 10},
        )
    )


def partition_count(settings: Settings, topic: str, consumer: Consumer | None = None) -> int:
    client = consumer or _consumer(settings)
    try:
        metadata = client.list_topics(topic, timeout=10)
    except Exception as exc:  # KafkaException: broker down
        raise BrokerUnavailable(f"could not read the metadata of topic {topic!r}: {exc}") from None
    finally:
        if consumer is None:
            client.close()
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise BrokerUnavailable(
            f"topic {topic!r} does not exist at {settings.bootstrap_servers}; "
            "run `pipeline topics create`"
        )
    return len(found.partitions)


def read_partition(
    settings: Settings,
    topic: str,
    group: bytes,
    on_record: Callable[[bytes, bytes | None], None],
    *,
    key_prefix: bytes = b"",
    idle_timeout: float = READ_IDLE_TIMEOUT,
) -> tuple[int, int]:
    """Call ``on_record(key, value)`` for every record of ``group``'s partition whose key starts
    with ``key_prefix``, oldest first, up to the end. Returns ``(partition, partition count)``."""
    consumer = _consumer(settings)
    try:
        count = partition_count(settings, topic, consumer)
        partition = pinned_partition(group, count)
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        last_progress = time.monotonic()
        while True:
            # consume() waits its whole timeout unless the batch fills: keep it short.
            messages = consumer.consume(10_000, 0.02)
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return partition, count
                    if error.fatal():
                        raise BrokerUnavailable(f"reading {topic!r}: {error.str()}")
                    log.warning("reading %s: %s", topic, error.str())
                    continue
                key = message.key() or b""
                if key.startswith(key_prefix):
                    on_record(key, message.value())
            now = time.monotonic()
            if messages:
                last_progress = now
            elif now - last_progress > idle_timeout:
                raise BrokerUnavailable(
                    f"reading {topic!r} partition {partition} stalled: no record and no end of "
                    f"partition within {idle_timeout:.0f} s"
                )
    finally:
        consumer.close()


class AckedProducer:
    """A producer whose ``flush`` says whether Kafka acknowledged everything since the last one.

    producer = AckedProducer(settings)
    producer.produce(topic, key, value, partition=3)
    producer.flush()        # raises BrokerUnavailable if acks are missing
    producer.failed         # refusals, e.g. ["Broker: Message size too large"]
    """

    def __init__(self, settings: Settings, *, buffer_timeout: float = FLUSH_TIMEOUT) -> None:
        self._producer = make_producer(settings)
        self._buffer_timeout = buffer_timeout
        self._produced = 0
        self.acked = 0
        self.failed: list[str] = []

    def _on_delivery(self, error: KafkaError | None, _message: Any) -> None:
        if error is None:
            self.acked += 1
        elif len(self.failed) < 100:
            self.failed.append(error.str())
        else:
            self.failed.append("")  # counted; the first 100 texts are enough to report

    def produce(
        self, topic: str, key: bytes | None, value: bytes | None, *, partition: int | None = None
    ) -> None:
        extra: dict[str, Any] = {} if partition is None else {"partition": partition}
        deadline = time.monotonic() + self._buffer_timeout
        while True:
            try:
                self._producer.produce(topic, value, key, on_delivery=self._on_delivery, **extra)
                break
            except BufferError:  # the local queue is full: let it drain
                if time.monotonic() > deadline:
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
