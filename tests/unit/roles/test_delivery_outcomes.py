"""``pipeline.roles.delivery_outcomes``: the watch over each destination (auto-disable) and the
dead letters' events, driven without a broker."""

from __future__ import annotations

import asyncio
from typing import Any

from pipeline.core.config import ConfigTable, Destination, Source
from pipeline.core.outcomes import Outcome
from pipeline.core.topics import Topics
from pipeline.kafka.codec import Codec
from pipeline.kafka.config_store import _decode_destination
from pipeline.kafka.events import EventEmitter
from pipeline.roles.delivery_outcomes import DestinationWatch
from tests.unit.roles._fakes import FakeProducer

TOPICS = Topics("t.", retry_tiers=2)
CODEC = Codec.default()
URL = "https://a.example/h"
TABLE = ConfigTable.build(
    [Source(id="web", write_keys=["wk"])],
    [Destination(id="hooks", sources=["web"], webhooks=[{"url": URL}], disable_after=60)],
)


def watched(producer: FakeProducer, outcomes: list[tuple[Destination, Outcome, float]]) -> None:
    """Tell a watch of ``outcomes`` and wait for what it started."""

    async def go() -> None:
        tasks: set[asyncio.Task[None]] = set()
        events = EventEmitter(producer, CODEC, TOPICS.events)
        watch = DestinationWatch(
            role="deliver",
            topics=TOPICS,
            codec=CODEC,
            producer=producer,
            events=events,
            stop=asyncio.Event(),
            spawn=lambda coroutine: tasks.add(asyncio.create_task(coroutine)),
        )
        for destination, outcome, at in outcomes:
            watch.outcome(destination, outcome, at)
            if at == 1099.0:
                assert producer.sent == []  # 59 s of failures: not yet
        while tasks:
            await asyncio.gather(*tasks)
            tasks.clear()
            await events.aclose()

    asyncio.run(go())


def events(producer: FakeProducer) -> list[dict[str, Any]]:
    return [
        CODEC.decode("OperationalEvent", value)
        for topic, _, value, *_ in producer.sent
        if topic == TOPICS.events
    ]


def _decode(value: bytes) -> Destination:
    return _decode_destination(CODEC.decode("Destination", value))


def test_a_destination_failing_every_attempt_for_disable_after_is_disabled() -> None:
    producer = FakeProducer()
    destination = TABLE.destinations["hooks"]
    watched(
        producer,
        [
            (destination, Outcome.RETRY, 1000.0),
            (destination, Outcome.DELIVERED, 1030.0),  # a success ends the run
            (destination, Outcome.RETRY, 1040.0),
            (destination, Outcome.DEAD_LETTER, 1099.0),  # 59 s: not yet
            (destination, Outcome.RETRY, 1100.0),  # 60 s of failures
            (destination, Outcome.RETRY, 1101.0),  # once is enough
        ],
    )
    [(topic, key, value)] = [r for r in producer.sent if r[0] == TOPICS.config]
    disabled = _decode(value)
    assert key == b"destination:hooks" and not disabled.enabled
    assert disabled.disabled_at == 1_100_000
    assert disabled.disabled_reason == "every attempt failed for 1m (disable_after 1m)"
    assert [e["kind"] for e in events(producer)] == ["destination_disabled"]


def test_a_destination_enabled_again_is_disabled_again_after_a_new_run() -> None:
    producer = FakeProducer()
    destination = TABLE.destinations["hooks"]
    # Enabled again in the console: the config holds another version of it.
    again = destination.model_copy(update={"name": "Hooks"})
    watched(
        producer,
        [
            (destination, Outcome.RETRY, 1000.0),
            (destination, Outcome.RETRY, 1060.0),  # disabled
            (destination, Outcome.RETRY, 1070.0),  # the config does not say so yet
            (again, Outcome.RETRY, 1100.0),  # a new run starts here
            (again, Outcome.RETRY, 1159.0),  # 59 s: not yet
            (again, Outcome.RETRY, 1160.0),  # disabled again
        ],
    )
    disabled_at = [
        _decode(value).disabled_at
        for topic, _, value, *_ in producer.sent
        if topic == TOPICS.config
    ]
    assert disabled_at == [1_060_000, 1_160_000]


def test_a_destination_without_disable_after_is_never_disabled() -> None:
    producer = FakeProducer()
    plain = TABLE.destinations["hooks"].model_copy(update={"disable_after": None})
    watched(producer, [(plain, Outcome.RETRY, 1000.0), (plain, Outcome.RETRY, 90_000.0)])
    assert producer.sent == []
