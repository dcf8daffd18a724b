"""Compacted state topics that commands read and write: ``deletion-requests``, ``audience-state``.

A command reads the state it needs, decides, produces, and writes the new state. Two helpers:

``pinned_partition``
    Records of one group (one audience, one user's deletion request) always go to one partition,
    chosen by a stable CRC-32 of the group, so a reader reads that partition only. Compaction
    keeps working because a key always lands in the same partition; do not change the partition
    count of these topics afterwards (the same rule as for any keyed compacted topic).

``read_partition``
    Reads one partition to its end (``pipeline.kafka.topic_reader.read_topic``), keeping only
    keys with a given prefix.

Writes go through ``pipeline.kafka.producer.AckedProducer``: the caller moves to its next step
only when Kafka acknowledged the previous one.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

from pipeline.core.settings import Settings
from pipeline.kafka.topic_reader import READ_IDLE_TIMEOUT, TopicReader, read_topic

__all__ = ["pinned_partition", "partition_count", "read_partition"]


def pinned_partition(group: bytes, partitions: int) -> int:
    """The partition of every record of ``group``: stable across processes and machines.

    >>> pinned_partition(b"web/vip", 6)
    1
    """
    return zlib.crc32(group) % partitions


def partition_count(settings: Settings, topic: str) -> int:
    reader = TopicReader(settings, topic)
    try:
        return len(reader.partitions())
    finally:
        reader.close()


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
    count = partition_count(settings, topic)
    partition = pinned_partition(group, count)
    for message in read_topic(settings, topic, partitions=[partition], idle_timeout=idle_timeout):
        key = message.key() or b""
        if key.startswith(key_prefix):
            on_record(key, message.value())
    return partition, count
