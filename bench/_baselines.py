"""Reference figures measured in the same run as ours: raw aiohttp POSTs and a Kafka topic reader."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
from confluent_kafka import Consumer, KafkaError, TopicPartition

from pipeline._kafka import consumer_config
from pipeline._settings import Settings

from ._harness import Receiver, rate, wait_answered


async def _post_all(
    receiver: Receiver, body: bytes, headers: dict[str, str], count: int, concurrency: int
) -> None:
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        url = receiver.url()

        async def post() -> None:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()

        # Warm-up: open the connections first, as a running worker has them.
        await asyncio.gather(*(post() for _ in range(concurrency)))
        receiver.reset()
        left = iter(range(count))

        async def worker() -> None:
            for _ in left:
                await post()

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def raw_post_rate(
    receiver: Receiver, body: bytes, headers: dict[str, str], count: int, concurrency: int
) -> float:
    """Requests/s of a bare aiohttp loop POSTing ``body`` with ``concurrency`` in flight."""
    asyncio.run(_post_all(receiver, body, headers, count, concurrency))
    return rate(wait_answered(receiver, count, timeout=60))


def read_topic(settings: Settings, topic: str, timeout: float = 30.0) -> list[Any]:
    """Every record of ``topic`` now (to the end of each partition), as confluent messages."""
    consumer = Consumer(
        consumer_config(
            settings,
            f"bench-reader-{time.monotonic_ns()}",
            **{"enable.partition.eof": True, "statistics.interval.ms": 0},
        )
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        partitions = list(metadata.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        open_partitions = set(partitions)
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while open_partitions and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                error = message.error()
                if error is None:
                    out.append(message)
                elif error.code() == KafkaError._PARTITION_EOF:
                    open_partitions.discard(message.partition())
        return out
    finally:
        consumer.close()
