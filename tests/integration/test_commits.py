"""Prompt commits: the deliver role commits what it finished within ``commit_interval`` (so a crash
delivers again only what was in flight, plus at most one interval's worth), and the router's
offsets are committed by its transactions."""

from __future__ import annotations

from confluent_kafka import Consumer, TopicPartition

from pipeline.core.settings import Settings
from pipeline.kafka.clients import consumer_config, topics_for
from pipeline.kafka.topic_reader import read_topic
from tests.support import apply, send_calls, simple_config, stays, wait_for

CALLS = 60


def ends(settings: Settings, topic: str) -> dict[int, int]:
    """Per partition, the offset after its last record (transaction markers not counted)."""
    last: dict[int, int] = {}
    for record in read_topic(settings, topic):
        partition, offset = record.partition(), record.offset()
        assert partition is not None and offset is not None
        last[partition] = max(last.get(partition, 0), offset + 1)
    return last


def committed(settings: Settings, role: str, topic: str) -> dict[int, int]:
    consumer = Consumer(consumer_config(settings, f"{settings.topic_prefix}{role}"))
    try:
        partitions = [TopicPartition(topic, p) for p in range(settings.partitions)]
        return {
            tp.partition: tp.offset
            for tp in consumer.committed(partitions, timeout=10)
            if tp.offset >= 0
        }
    finally:
        consumer.close()


def deliver_all(settings, receiver_factory, worker_factory):
    receiver = receiver_factory()
    apply(settings, simple_config(receiver.url))
    worker = worker_factory(settings)
    calls = [{"type": "track", "userId": f"u{i}", "event": "E"} for i in range(CALLS)]
    send_calls(settings, calls, "wk")
    wait_for(lambda: receiver.count() == CALLS, timeout=60)
    return worker


def test_deliver_commits_what_it_finished_within_the_interval(
    settings, receiver_factory, worker_factory
):
    settings = settings.replace(commit_interval=0.1)
    deliver_all(settings, receiver_factory, worker_factory)
    topics = topics_for(settings)
    delivered = ends(settings, topics.deliveries)
    # Generous for a loaded machine, yet well under the 1 s the loop used to wait.
    wait_for(lambda: committed(settings, "deliver", topics.deliveries) == delivered, timeout=1.5)
    # The router's offsets were committed by its transactions, not by its consumer loop.
    assert committed(settings, "router", topics.calls) == ends(settings, topics.calls)


def test_the_commit_interval_is_the_one_set(settings, receiver_factory, worker_factory):
    settings = settings.replace(commit_interval=60.0)
    worker = deliver_all(settings, receiver_factory, worker_factory)
    topics = topics_for(settings)
    delivered = ends(settings, topics.deliveries)
    assert stays(lambda: committed(settings, "deliver", topics.deliveries) != delivered, 2.0)
    worker.stop()  # a clean stop commits at once
    assert committed(settings, "deliver", topics.deliveries) == delivered
