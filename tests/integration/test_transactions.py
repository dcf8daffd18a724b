"""PartitionTransactions against the broker: records and the consumed offset land together, and a
new owner of a partition fences the old one, whose later commits are refused and leave nothing."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition

from pipeline.core.settings import Settings
from pipeline.kafka.clients import consumer_config, make_producer, topics_for
from pipeline.kafka.topic_reader import read_topic
from pipeline.kafka.transactions import Fenced, PartitionTransactions, transactional_id
from tests.support import (
    ROOT,
    apply,
    send_calls,
    settings_env,
    simple_config,
    transactions_stall_is_expected,
    wait_for,
)


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


#: A router that dies by SIGKILL between sending its offsets and committing: its transaction stays
#: open, holding the group's offsets for those partitions as "unstable".
_DIES_MID_TRANSACTION = """
import os, signal, sys
from confluent_kafka import Consumer, Producer, TopicPartition
from pipeline.core.settings import Settings
from pipeline.kafka.clients import consumer_config, producer_config, topics_for
from pipeline.kafka.transactions import transactional_id

settings = Settings.from_env()
topics = topics_for(settings)
consumer = Consumer(consumer_config(settings, settings.topic_prefix + "router"))
consumer.subscribe([topics.calls])
taken = {}
while len(taken) < settings.partitions:
    for message in consumer.consume(10, 0.5):
        if message.error() is None:
            taken[message.partition()] = message.offset()
for partition, offset in taken.items():
    tid = transactional_id(settings, topics.calls, partition)
    producer = Producer(producer_config(settings, **{"transactional.id": tid}))
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topics.dlq, b"left open")
    producer.flush(10)
    offsets = [TopicPartition(topics.calls, partition, offset + 1)]
    producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
    producer.poll(0)
print("open", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_router_killed_before_its_commit_does_not_hold_its_successor_back(
    settings, receiver_factory, worker_factory
):
    calls = topics_for(settings).calls
    receiver = receiver_factory()
    apply(settings, simple_config(receiver.url))
    producer = make_producer(settings)
    for partition in range(settings.partitions):
        producer.produce(calls, b"not a call", partition=partition)
    producer.flush(10)
    child = subprocess.run(
        [sys.executable, "-c", _DIES_MID_TRANSACTION],
        env=settings_env(settings),
        cwd=ROOT,
        capture_output=True,
        timeout=60,
    )
    assert child.returncode == -signal.SIGKILL and b"open" in child.stdout, child.stderr[-2000:]

    # The delivery log off: its records in the router's transactions make the embedded broker's
    # stall more likely (docs/decisions.md, Kafka).
    worker_factory(settings.replace(transactions=True, log=False), ("router", "deliver"))
    send_calls(
        settings, [{"type": "track", "userId": f"u{i}", "event": "E"} for i in range(30)], "wk"
    )
    # The new router takes each partition's id on assignment, which ends the open transaction.
    # (Apache Kafka refuses a read_committed offset fetch while it is open; the embedded broker
    # does not, so here this shows that the successor is not held back, not why.) Its routed
    # records present but held from read_committed readers is the broker's stall, not the
    # successor held back: it routed them.
    with transactions_stall_is_expected(settings, topics_for(settings).deliveries):
        wait_for(lambda: receiver.count() == 30, timeout=60)
