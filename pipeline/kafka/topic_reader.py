"""Read a whole topic once, from the beginning to its current end.

"The end" is each partition's end-of-partition event, not the high watermark: the embedded broker's
watermark can lag the true end of the log.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from pipeline.core.exceptions import BrokerUnavailable
from pipeline.core.settings import Settings
from pipeline.kafka.clients import consumer_config

__all__ = ["read_topic"]


def read_topic(settings: Settings, topic: str, *, timeout: float = 60.0) -> Iterator[Message]:
    """Every record of ``topic`` present now, partition by partition in offset order."""
    consumer = Consumer(
        consumer_config(
            settings,
            f"pipeline-reader-{uuid.uuid4().hex[:8]}",  # required by librdkafka; never joined
            **{"enable.partition.eof": True, "fetch.wait.max.ms": 100},
        )
    )
    deadline = time.monotonic() + timeout
    try:
        metadata = consumer.list_topics(topic, timeout=min(timeout, 10))
        described = metadata.topics.get(topic)
        if described is None or described.error is not None or not described.partitions:
            raise BrokerUnavailable(
                f"topic {topic!r} does not exist (run `pipeline topics create`)"
            )
        pending = set(described.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in pending])
        while pending:
            if time.monotonic() > deadline:
                raise BrokerUnavailable(
                    f"could not read {topic!r} to its end within {timeout:.0f} s"
                )
            for message in consumer.consume(1000, 0.2):
                error = message.error()
                if error is None:
                    yield message
                elif error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(message.partition())
                else:
                    raise BrokerUnavailable(f"reading {topic!r}: {error.str()}")
    finally:
        consumer.close()
