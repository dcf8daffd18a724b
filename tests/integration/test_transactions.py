"""PartitionTransactions against the broker: records and the consumed offset land together, and a
new owner of a partition fences the old one, whose later commits are refused and leave nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition

from pipeline.core.settings import Settings
from pipeline.kafka.clients import consumer_config, make_producer, topics_for
from pipeline.kafka.topic_reader import read_topic
from pipeline.kafka.transactions import Fenced, PartitionTransactions, transactional_id
from tests.support import wait_for


@pytest.fixture
def member(settings: Settings) -> Iterator[Consumer]:
    """A member of a consumer group that owns every partition of ``calls`` (one record each)."""
    calls = topics_for(settings).calls
    producer = make_producer(settings)
    for partition in range(settings.partitions):
        producer.produce(calls, b"call", partition=partition)
    producer.flush(10)
    consumer = Consumer(consumer_config(settings, f"{settings.topic_prefix}router"))
    consumer.subscribe([calls])
    wait_for(lambda: consumer.consume(10, 0.2) and consumer.assignment(), timeout=30)
    yield consumer
    consumer.close()


def committed(settings: Settings, consumer: Consumer, partition: int) -> int:
    calls = topics_for(settings).calls
    return int(consumer.committed([TopicPartition(calls, partition)], timeout=10)[0].offset)


def values(settings: Settings) -> list[bytes]:
    return sorted(r.value() or b"" for r in read_topic(settings, topics_for(settings).deliveries))


def test_a_commit_writes_the_records_and_the_offset_together(settings, member):
    topics = topics_for(settings)
    transactions = PartitionTransactions(settings, topics.calls, 0)
    try:
        transactions.commit(
            [(topics.deliveries, b"k", b"one"), (topics.deliveries, b"k", b"two")],
            next_offset=1,
            group=member.consumer_group_metadata(),
        )
    finally:
        transactions.close()
    assert values(settings) == [b"one", b"two"]
    assert committed(settings, member, 0) == 1
    assert transactions.id == transactional_id(settings, topics.calls, 0)


def test_the_next_owner_fences_the_last_and_its_commits_leave_nothing(settings, member):
    topics = topics_for(settings)
    group = member.consumer_group_metadata()
    zombie = PartitionTransactions(settings, topics.calls, 1)
    owner = PartitionTransactions(settings, topics.calls, 1)
    try:
        zombie.commit([(topics.deliveries, b"k", b"before")], next_offset=1, group=group)
        owner.commit([(topics.deliveries, b"k", b"owner")], next_offset=1, group=group)
        with pytest.raises(Fenced):
            zombie.commit([(topics.deliveries, b"k", b"zombie")], next_offset=7, group=group)
        assert zombie.fenced
        with pytest.raises(Fenced):  # and stays fenced: it never takes the id back
            zombie.commit([(topics.deliveries, b"k", b"again")], next_offset=7, group=group)
    finally:
        zombie.close()
        owner.close()
    assert values(settings) == [b"before", b"owner"]
    assert committed(settings, member, 1) == 1


def test_another_partition_is_not_fenced(settings, member):
    topics = topics_for(settings)
    group = member.consumer_group_metadata()
    first = PartitionTransactions(settings, topics.calls, 0)
    second = PartitionTransactions(settings, topics.calls, 2)
    try:
        first.commit([(topics.deliveries, None, uuid.uuid4().bytes)], next_offset=1, group=group)
        second.commit([(topics.deliveries, None, b"x")], next_offset=1, group=group)
        first.commit([(topics.deliveries, None, b"y")], next_offset=1, group=group)
    finally:
        first.close()
        second.close()
    assert len(values(settings)) == 3
