"""A batching destination's calls through ``DeliveryHandler``, without a broker or HTTP: how they
are gathered, what one request carries, and what each call is handed off as."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

from pipeline.core.batching import batch_body, batch_label
from pipeline.core.config import Batch, ConfigTable, Destination, Source
from pipeline.core.delivery_policy import Conclusion
from pipeline.core.outcomes import Outcome
from pipeline.core.retry_schedule import RetrySchedule
from pipeline.core.settings import Settings
from pipeline.kafka.log_reading import decode_log_records
from pipeline.roles.batches import aligned
from pipeline.roles.deliver import DeliveryHandler
from tests.unit.roles._fakes import FakeLoop, FakeProducer, FakeSender
from tests.unit.roles.test_deliver_handler import (
    CODEC,
    E503,
    OK,
    SCHEDULE,
    TOPICS,
    URL,
    delivery,
    encoded,
    handler_for,
    taken,
)


def table(**batch: Any) -> ConfigTable:
    batched = Destination(
        id="hooks", sources=["web"], webhooks=[{"url": URL}], batch=Batch(**batch)
    )
    return ConfigTable.build([Source(id="web", write_keys=["wk"])], [batched])


def records(count: int, body: bytes = b'{"a":1}', partition: int = 2) -> list[Any]:
    return [
        taken(
            TOPICS.deliveries,
            encoded(delivery(message_id=f"m{n}", body=body)),
            key=f"hooks/u{n}".encode(),
            partition=partition,
            offset=10 + n,
        )
        for n in range(count)
    ]


def handled(
    batch: list[Any],
    sender: FakeSender,
    config: ConfigTable,
    *,
    schedule: RetrySchedule | None = None,
    settings: Settings | None = None,
    then: Any = None,
) -> tuple[DeliveryHandler, FakeLoop, FakeProducer]:
    """Handle ``batch``, run ``then(handler)`` (if given), and wait for every task."""
    loop, producer = FakeLoop(), FakeProducer()
    settings = settings or Settings()

    async def go() -> DeliveryHandler:
        handler = handler_for(
            producer, sender, table=config, settings=settings, schedule=schedule or SCHEDULE
        )
        handler.assigned([(TOPICS.deliveries, 2)])
        await handler.handle(batch, loop)
        if then is not None:
            then(handler)
        await asyncio.sleep(0.2)  # past every batch's max_wait
        while handler._tasks:
            await handler.aclose()
        return handler

    return asyncio.run(go()), loop, producer


def bodies(sender: FakeSender) -> list[list[Any]]:
    return [orjson.loads(body) for _, body, *_ in sender.attempts]


def test_calls_go_max_events_a_request_as_one_json_array() -> None:
    sender = FakeSender(lambda d: [OK])
    batch = records(7)
    handler, loop, _ = handled(batch, sender, table(max_events=3, max_wait=0.05))
    assert [len(array) for array in bodies(sender)] == [3, 3, 1]
    assert bodies(sender)[0] == [{"a": 1}] * 3
    assert all(ident.startswith("batch_") for _, _, ident, *_ in sender.attempts)
    assert len({ident for _, _, ident, *_ in sender.attempts}) == 3  # an id a batch
    assert sorted(r.offset for r in loop.finished) == [r.offset for r in batch]
    assert handler._in_flight == {"hooks": 0}


def test_a_batch_goes_at_max_wait_when_it_does_not_fill() -> None:
    sender = FakeSender(lambda d: [OK])
    started = time.time()
    handled(records(2), sender, table(max_events=100, max_wait=0.1))
    [(_, body, _, _, sent_at)] = sender.attempts
    assert len(orjson.loads(body)) == 2
    assert sent_at - started >= 0.1


def test_a_batch_never_goes_over_max_bytes() -> None:
    sender = FakeSender(lambda d: [OK])
    body = orjson.dumps({"pad": "x" * 390})  # 402 bytes: two fit in 1,024 with "[", "," and "]"
    handled(records(5, body), sender, table(max_bytes=1024, max_wait=0.05))
    sizes = [len(sent) for _, sent, *_ in sender.attempts]
    assert [len(array) for array in bodies(sender)] == [2, 2, 1]
    assert max(sizes) <= 1024


def test_a_call_over_max_bytes_on_its_own_goes_alone() -> None:
    sender = FakeSender(lambda d: [OK])
    big = orjson.dumps({"pad": "x" * 2000})
    batch = records(1, big)
    handled(batch, sender, table(max_bytes=1024, max_wait=0.05))
    assert [sent for _, sent, *_ in sender.attempts] == [batch_body([big])]


def test_a_failed_batch_goes_to_one_tier_with_one_due_time() -> None:
    """The schedule's jitter would spread the five over two seconds: they come back together."""
    sender = FakeSender(lambda d: [E503])
    jittery = RetrySchedule(delays=(10.0, 60.0), deadline=1000.0, jitter=0.1)
    _, loop, producer = handled(records(5), sender, table(max_wait=0.05), schedule=jittery)
    retried = [
        CODEC.decode("Delivery", value)
        for topic, _, value, *_ in producer.sent
        if topic == TOPICS.retry[0]
    ]
    assert sorted(r["messageId"] for r in retried) == [f"m{n}" for n in range(5)]
    assert len({r["notBefore"] for r in retried}) == 1
    assert len(loop.finished) == 5


def test_each_calls_log_names_its_batch() -> None:
    sender = FakeSender(lambda d: [OK])
    settings = Settings(log=True)
    _, _, producer = handled(records(3), sender, table(max_wait=0.05), settings=settings)
    [(_, _, ident, *_)] = sender.attempts
    attempts = [
        entry
        for topic, _, value, *_ in producer.sent
        if topic == TOPICS.log
        for record in decode_log_records(CODEC, value)
        for entry in record["entries"]
        if entry["kind"] == "attempt"
    ]
    assert len(attempts) == 3
    assert {entry["reason"] for entry in attempts} == {batch_label(ident, 3)}
    assert {entry["status"] for entry in attempts} == {200}


def test_calls_of_a_partition_lost_while_gathered_are_dropped_unsent() -> None:
    sender = FakeSender(lambda d: [OK])
    kept, lost = records(2, partition=2), records(2, partition=1)

    def lose(handler: DeliveryHandler) -> None:
        handler.released([(TOPICS.deliveries, 1)])

    handler, loop, _ = handled(kept + lost, sender, table(max_wait=0.05), then=lose)
    [array] = bodies(sender)
    assert len(array) == 2
    assert sorted(r.key[1] for r in loop.finished) == [2, 2]
    assert handler._in_flight == {"hooks": 0}


def test_a_batch_takes_one_turn_of_the_rate_limit() -> None:
    """``rate_limit`` counts requests: ten calls in batches of five are two turns, not ten."""
    limited = Destination(
        id="hooks",
        sources=["web"],
        webhooks=[{"url": URL}],
        batch=Batch(max_events=5, max_wait=0.05),
        rate_limit=2.0,
    )
    config = ConfigTable.build([Source(id="web", write_keys=["wk"])], [limited])
    sender = FakeSender(lambda d: [OK])
    started = time.monotonic()
    _, loop, _ = handled(records(10), sender, config)
    assert [len(array) for array in bodies(sender)] == [5, 5]
    assert len(loop.finished) == 10
    assert time.monotonic() - started < 3.0  # ten turns at 2/s would take 4.5 s


def retry(not_before: int, tier: int = 0) -> Conclusion:
    return Conclusion(Outcome.RETRY, delivery(not_before=not_before, tier=tier))


def test_aligned_moves_a_tiers_retries_to_its_earliest_due_time_never_later() -> None:
    done = Conclusion(Outcome.DELIVERED, delivery())
    out = aligned([retry(1_300), done, retry(1_000), retry(5_000, tier=1), retry(4_000, tier=1)])
    assert [c.delivery.not_before for c in out if isinstance(c, Conclusion)] == [
        1_000,
        0,
        1_000,
        4_000,
        4_000,
    ]
    assert out[1] is done


def test_batch_body_and_label() -> None:
    assert batch_body([b"{}"]) == b"[{}]"
    assert batch_label("batch_ab", 1) == "batch_ab of 1 call"
    assert batch_label("batch_ab", 100) == "batch_ab of 100 calls"


def test_an_unbatched_destination_still_sends_one_call_a_request() -> None:
    plain = ConfigTable.build(
        [Source(id="web", write_keys=["wk"])],
        [Destination(id="hooks", sources=["web"], webhooks=[{"url": URL}])],
    )
    sender = FakeSender(lambda d: [OK])
    handled(records(3), sender, plain)
    assert [body for _, body, *_ in sender.attempts] == [b'{"a":1}'] * 3


def test_a_final_call_sends_its_batch_at_once() -> None:
    """A call at its last slot before its deadline waits for nothing, not even max_wait."""
    from pipeline.roles.batches import Batches
    from pipeline.roles.delivery_decisions import Start

    spawned: list[Any] = []
    destination = table(max_wait=30.0).destinations["hooks"]

    async def go() -> None:
        batches = Batches(None, None, {"hooks": 2}, spawned.append)  # type: ignore[arg-type]
        [first, last] = records(2)
        batches.add(first, Start(delivery(), destination, False, None), FakeLoop())
        assert spawned == [] and len(batches) == 1  # gathering, for up to 30 s
        batches.add(last, Start(delivery(), destination, True, None), FakeLoop())
        assert len(spawned) == 1 and len(batches) == 0  # gone with the final call
        spawned[0].close()

    asyncio.run(go())
