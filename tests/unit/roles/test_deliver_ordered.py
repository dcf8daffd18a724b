"""An ordered destination's records in the delivery handler, without a broker or HTTP: the router's
parker leaves them to the user's lane, and a call that held its user back releases it when it has
its outcome in a retry tier. (The lanes themselves run against a real broker:
tests/integration/test_ordering.py.)"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pipeline.core.config import ConfigTable, Destination, Source
from pipeline.core.outcomes import Failure, UrlResult
from pipeline.core.records import Delivery, delivery_to_record
from pipeline.core.retry_schedule import RetrySchedule
from pipeline.core.settings import Settings
from pipeline.core.topics import Topics
from pipeline.kafka.codec import Codec
from pipeline.roles.deliver import DeliveryHandler
from pipeline.roles.hand_offs import PASSED
from pipeline.roles.holds import Release, release_of
from pipeline.roles.parking import PartMessage, schedule_header
from tests.unit.roles._fakes import (
    FakeFollower,
    FakeLoop,
    FakeProducer,
    FakeSender,
    health_of,
    open_circuit,
    taken,
)

TOPICS = Topics("t.", retry_tiers=2)
CODEC = Codec.default()
URL = "https://a.example/h"
TABLE = ConfigTable.build(
    [Source(id="web", write_keys=["wk"])],
    [
        Destination(id="ordered", sources=["web"], webhooks=[{"url": URL}], ordering="per_user"),
        Destination(id="plain", sources=["web"], webhooks=[{"url": URL}]),
    ],
)
OK = [UrlResult(URL, 200)]
E404 = [UrlResult(URL, 404, Failure.CLIENT_ERROR, "404")]


def handler(producer: FakeProducer, answers: list[UrlResult], **health: Any) -> DeliveryHandler:
    settings = Settings(log=False)
    found = health_of(settings)
    if health.get("circuit_open"):
        open_circuit(found, URL)
    return DeliveryHandler(
        "retry",
        list(TOPICS.retry),
        settings=settings,
        topics=TOPICS,
        follower=FakeFollower(TABLE),
        producer=producer,
        sender=FakeSender(lambda _destination: answers),
        health=found,
        stop=asyncio.Event(),
        codec=CODEC,
        schedule=RetrySchedule(delays=(10.0, 60.0), deadline=1000.0, jitter=0.0),
    )


def in_a_tier(destination: str) -> Any:
    """A record of ``destination`` in tier 0, due now (it waited: for an ordered destination, it
    holds its user's later calls back)."""
    now = int(time.time() * 1000)
    record = Delivery("m 1", destination, "web", "track", b"{}", now, now, now + 10**6, now, 0)
    value = CODEC.encode("Delivery", delivery_to_record(record))
    header = schedule_header(0, now, now, now + 10**6, destination)
    key = f"{destination}/u1".encode()
    return taken(TOPICS.retry[0], value, key=key, headers=[header])


def handled(record: Any, answers: list[UrlResult]) -> FakeProducer:
    producer = FakeProducer()

    async def go() -> None:
        handling = handler(producer, answers)
        await handling.handle([record], FakeLoop())
        while handling._tasks:
            await handling.aclose()

    asyncio.run(go())
    return producer


def releases(producer: FakeProducer) -> list[tuple[bytes | None, Release | None]]:
    return [
        (key, release_of(PartMessage(key, value, rest[0] if rest else [])))
        for topic, key, value, *rest in producer.sent
        if topic == TOPICS.deliveries
    ]


def test_an_ordered_destinations_call_delivered_from_a_tier_releases_its_user() -> None:
    producer = handled(in_a_tier("ordered"), OK)
    assert releases(producer) == [(b"ordered/u1", Release("delivered", "web", "track", "m 1"))]


def test_one_dead_lettered_releases_its_user_and_its_dead_letter_says_so() -> None:
    producer = handled(in_a_tier("ordered"), E404)
    assert releases(producer) == [(b"ordered/u1", Release("dead_lettered", "web", "track", "m 1"))]
    [letter] = [CODEC.decode("DeadLetter", v) for t, _, v, *_ in producer.sent if t == TOPICS.dlq]
    assert PASSED in letter["detail"]


def test_an_unordered_destinations_call_releases_no_one() -> None:
    producer = handled(in_a_tier("plain"), OK)
    assert releases(producer) == []
    letters = handled(in_a_tier("plain"), E404)
    assert releases(letters) == []
    [letter] = [CODEC.decode("DeadLetter", v) for t, _, v, *_ in letters.sent if t == TOPICS.dlq]
    assert PASSED not in letter["detail"]


def test_a_call_retried_again_still_holds_its_user() -> None:
    producer = handled(in_a_tier("ordered"), [UrlResult(URL, 503, Failure.SERVER_ERROR, "503")])
    assert releases(producer) == []
    assert [topic for topic, *_ in producer.sent] == [TOPICS.retry[1]]  # the next tier


def test_the_routers_parker_leaves_an_ordered_destinations_records_to_their_lanes() -> None:
    handling = handler(FakeProducer(), OK, circuit_open=True)
    parker = handling.parking.routing_parker(TABLE.destinations)
    assert not parker(b"ordered/u1", b"value", "ordered")
    assert parker(b"plain/u1", b"value", "plain")  # the same circuit: parked at routing
    assert parker.parked == 1
