"""Prompt commits: the deliver role commits what it finished within ``commit_interval`` (so a crash
delivers again only what was in flight, plus at most one interval's worth), and the router's
offsets are committed by its transactions."""

from __future__ import annotations

import asyncio
import time

from pipeline.kafka import consumer_loop
from pipeline.kafka.clients import make_producer, topics_for
from pipeline.kafka.consumer_loop import ConsumedRecord, ConsumerLoop
from tests.support import (
    apply,
    group_positions,
    send_calls,
    simple_config,
    stays,
    topic_ends,
    transactions_stall_is_expected,
    wait_for,
)

CALLS = 60


class Holding:
    """A handler that keeps what it is given (finishing nothing), and when each record came."""

    role = "deliver"

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.taken: list[ConsumedRecord] = []
        self.arrived: list[float] = []
        self.batches: list[list[bytes | None]] = []

    def topics(self) -> list[str]:
        return [self.topic]

    async def handle(self, batch: list[ConsumedRecord], loop: ConsumerLoop) -> None:
        self.taken.extend(batch)
        self.arrived.extend(time.monotonic() for _ in batch)
        self.batches.append([taken.message.key() for taken in batch])

    def assigned(self, keys: object) -> None:
        return None

    def released(self, keys: object) -> None:
        return None

    async def aclose(self) -> None:
        return None


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
    settings = settings.replace(commit_interval=0.1, transactions=True, log=False)
    with transactions_stall_is_expected(settings, topics_for(settings).deliveries):
        deliver_all(settings, receiver_factory, worker_factory)
    topics = topics_for(settings)
    delivered = topic_ends(settings, topics.deliveries)
    # Generous for a loaded machine, yet well under the 1 s the loop used to wait.
    wait_for(
        lambda: group_positions(settings, "deliver", topics.deliveries) == delivered, timeout=1.5
    )
    # The router's offsets were committed by its transactions, not by its consumer loop.
    assert group_positions(settings, "router", topics.calls) == topic_ends(settings, topics.calls)


def test_the_commit_interval_is_the_one_set(settings, receiver_factory, worker_factory):
    settings = settings.replace(commit_interval=60.0)
    worker = deliver_all(settings, receiver_factory, worker_factory)
    topics = topics_for(settings)
    delivered = topic_ends(settings, topics.deliveries)
    assert stays(lambda: group_positions(settings, "deliver", topics.deliveries) != delivered, 2.0)
    worker.stop()  # a clean stop commits at once
    assert group_positions(settings, "deliver", topics.deliveries) == delivered


def test_the_loop_never_holds_more_than_max_in_flight(settings):
    """A handler that finishes nothing gets exactly ``max_in_flight`` records, however many wait
    (a batch takes only the room left), and more as soon as it finishes some."""
    topics = topics_for(settings)
    producer = make_producer(settings)
    for i in range(200):
        producer.produce(topics.deliveries, b"x", f"k{i}".encode())
    producer.flush(10)

    async def main() -> tuple[int, int]:
        handler = Holding(topics.deliveries)
        loop = ConsumerLoop(settings, f"{settings.topic_prefix}holding", handler, max_in_flight=7)
        stop = asyncio.Event()
        running = asyncio.create_task(loop.run(stop))
        deadline = time.monotonic() + 30
        while len(handler.taken) < 7 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # several consume rounds: none may take more
        held = len(handler.taken)
        for taken in handler.taken[:3]:
            loop.finish(taken)
        while len(handler.taken) < held + 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        after = len(handler.taken)
        stop.set()
        for taken in handler.taken[3:]:
            loop.finish(taken)
        await running
        return held, after

    assert asyncio.run(main()) == (7, 10)


def test_a_record_goes_to_work_as_soon_as_it_is_fetched(settings, monkeypatch):
    """A consume of a batch waits until the batch is full or its wait is over, and a lone record
    waited with it (at each hop of a quiet pipeline). With a wait of 10 s, a record produced
    while the loop waits reaches the handler long before the wait is over."""
    monkeypatch.setattr(consumer_loop, "CONSUME_WAIT", 10.0)
    topics = topics_for(settings)
    producer = make_producer(settings)

    def produce(key: bytes) -> float:
        producer.produce(topics.deliveries, b"x", key)
        producer.flush(10)
        return time.monotonic()

    produce(b"first")

    async def main() -> float:
        handler = Holding(topics.deliveries)
        loop = ConsumerLoop(settings, f"{settings.topic_prefix}quiet", handler)
        stop = asyncio.Event()
        running = asyncio.create_task(loop.run(stop))
        deadline = time.monotonic() + 30
        while not handler.taken and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # the loop waits in a consume now
        sent = await asyncio.to_thread(produce, b"second")
        while len(handler.taken) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert [taken.message.key() for taken in handler.taken] == [b"first", b"second"]
        waited = handler.arrived[1] - sent
        stop.set()
        await asyncio.to_thread(produce, b"third")  # ends the consume under way
        for taken in handler.taken:
            loop.finish(taken)
        await running
        return waited

    waited = asyncio.run(main())
    print(f"a lone record reached the handler {waited * 1000:.0f} ms after Kafka had it")
    assert waited < 5.0


def test_a_loop_told_to_gather_waits_that_long_for_a_fuller_batch(settings):
    """A handler that pays for each batch (the router's transaction, the log store's commit)
    gets what comes within ``gather`` in one batch."""
    topics = topics_for(settings)
    producer = make_producer(settings)

    def produce(key: bytes) -> None:
        producer.produce(topics.deliveries, b"x", key)
        producer.flush(10)

    produce(b"first")

    async def main() -> list[list[bytes | None]]:
        handler = Holding(topics.deliveries)
        loop = ConsumerLoop(settings, f"{settings.topic_prefix}gathering", handler, gather=3.0)
        stop = asyncio.Event()
        running = asyncio.create_task(loop.run(stop))
        deadline = time.monotonic() + 30
        while not handler.taken and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.to_thread(produce, b"second")
        await asyncio.sleep(0.3)
        await asyncio.to_thread(produce, b"third")
        while len(handler.taken) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stop.set()
        for taken in handler.taken:
            loop.finish(taken)
        await running
        return handler.batches

    assert asyncio.run(main())[-1] == [b"second", b"third"]


def test_a_concluded_record_leaves_the_in_flight_count_and_is_committed_only_once_finished(
    settings,
):
    """A record whose work is done and whose outcome awaits Kafka's acknowledgement
    (``concluded``) makes room for another, yet stays uncommitted until finished; records
    unfinished, concluded or not, never number more than twice ``max_in_flight``."""
    topics = topics_for(settings)
    producer = make_producer(settings)
    for i in range(200):
        producer.produce(topics.deliveries, b"x", f"k{i}".encode())
    producer.flush(10)
    group = "concluding"

    async def main() -> tuple[list[int], list[tuple[int, int]]]:
        handler = Holding(topics.deliveries)
        loop = ConsumerLoop(
            settings,
            f"{settings.topic_prefix}{group}",
            handler,
            max_in_flight=7,
            commit_interval=0.1,
            revoke_grace=0.5,
        )
        stop = asyncio.Event()
        running = asyncio.create_task(loop.run(stop))
        counts = []

        async def settled(at_least: int) -> None:
            deadline = time.monotonic() + 30  # each step its own: the first waits for the group
            while len(handler.taken) < at_least and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # several consume rounds: none may take more
            counts.append(len(handler.taken))

        await settled(7)
        for taken in handler.taken[:3]:
            loop.concluded(taken)
        await settled(10)  # three more in flight
        for taken in handler.taken[3:]:
            loop.concluded(taken)
        await settled(14)  # 7 in flight at most, but 14 unfinished at most
        for taken in handler.taken[10:]:
            loop.concluded(taken)
        await settled(14)  # 14 concluded, none finished: no room
        for taken in handler.taken[:3]:
            loop.finish(taken)
        await settled(17)
        stop.set()  # the rest stay unfinished: the shutdown commits only what finished
        await running
        return counts, [(t.key[1], t.offset) for t in handler.taken[:3]]

    counts, finished = asyncio.run(main())
    assert counts == [7, 10, 14, 14, 17]
    expected = {}
    for partition in {number for number, _ in finished}:
        position = 0
        while (partition, position) in finished:
            position += 1
        if position:
            expected[partition] = position
    assert expected  # the first records taken start their partitions at offset 0
    assert group_positions(settings, group, topics.deliveries) == expected
