"""Compacted state topics that commands read and write: ``deletion-requests``, ``audience-state``.

A command reads the state it needs, decides, produces, and writes the new state. Two helpers:

``pinned_partition``
    Records of one group (one audience, one user's deletion request) always go to one partition,
    chosen by a stable CRC-32 of the group, so a reader reads that partition only. Compaction
    keeps working because a key always lands in the same partition; do not change the partition
    count of these topics afterwards (the same rule as for any keyed compacted topic).

``read_partition``
    Reads one partition from the beginning to its end, as ``enable.partition.eof`` reports it
    (the embedded broker's high watermark can lag the true end of the log, so it is not used),
    without a consumer group, keeping only keys with a given prefix.

Writes go through ``pipeline.kafka.producer.AckedProducer``: the caller moves to its next step
only when Kafka acknowledged the previous one.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from pipeline.core.exceptions import BrokerUnavailable
from pipeline.core.settings import Settings
from pipeline.kafka.clients import consumer_config

__all__ = ["pinned_partition", "partition_count", "read_partition"]

log = logging.getLogger("pipeline.state")

#: A read with no message and no end-of-partition for this long means the broker is gone.
READ_IDLE_TIMEOUT = 30.0


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
