"""``RouterHandler`` driven without a broker: what it produces and finishes for a batch."""

from __future__ import annotations

import asyncio
from typing import Any

from pipeline import parse_call
from pipeline.core.config import ConfigTable, Destination, Source
from pipeline.core.records import call_to_record
from pipeline.core.render import render_body
from pipeline.core.topics import Topics
from pipeline.kafka.codec import Codec
from pipeline.kafka.registry_codec import SchemaRegistryUnavailable
from pipeline.roles.router import RouterHandler
from tests.unit.roles._fakes import FakeFollower, FakeLoop, FakeProducer, RegistryDown, taken

TOPICS = Topics("t.", retry_tiers=2)
CODEC = Codec.default()
TABLE = ConfigTable.build(
    [Source(id="web", write_keys=["wk"], blocked_events=["Heartbeat"])],
    [
        Destination(id=d, sources=["web"], webhooks=[{"url": f"https://x/{d}"}])  # type: ignore[list-item]
        for d in ("hooks-a", "hooks-b")
    ],
)


def call_value(raw: dict[str, Any]) -> bytes:
    return CODEC.encode("Call", call_to_record(parse_call(raw, source_id="web", received_at=1)))


def run(
    values: list[bytes | None], codec: Any = CODEC
) -> tuple[RouterHandler, FakeLoop, FakeProducer, list[Any]]:
    loop, producer = FakeLoop(), FakeProducer()
    batch = [taken(TOPICS.calls, v, partition=1, offset=i) for i, v in enumerate(values)]

    async def go() -> RouterHandler:
        handler = RouterHandler(
            topics=TOPICS,
            follower=FakeFollower(TABLE),  # type: ignore[arg-type]
            producer=producer,  # type: ignore[arg-type]
            stop=asyncio.Event(),
            codec=codec,
        )
        await handler.handle(batch, loop)  # type: ignore[arg-type]
        return handler

    return asyncio.run(go()), loop, producer, batch


def test_a_batch_routes_drops_and_dead_letters_then_finishes_every_record() -> None:
    track = {"type": "track", "event": "Order", "userId": "u1", "messageId": "m1"}
    blocked = {"type": "track", "event": "Heartbeat", "userId": "u2"}
    _, loop, producer, batch = run([call_value(track), call_value(blocked), b"junk"])
    [a, b, dlq] = producer.sent
    assert [(topic, key) for topic, key, _ in (a, b)] == [
        (TOPICS.deliveries, b"hooks-a/u1"),
        (TOPICS.deliveries, b"hooks-b/u1"),
    ]
    record = CODEC.decode("Delivery", a[2])
    body = render_body(parse_call(track, source_id="web", received_at=1))
    assert (record["messageId"], record["destinationId"], record["body"], record["tier"]) == (
        "m1",
        "hooks-a",
        body,
        -1,
    )
    assert (dlq[0], dlq[1]) == (TOPICS.dlq, None)
    letter = CODEC.decode("DeadLetter", dlq[2])
    assert (letter["reason"], letter["raw"], letter["sourcePartition"], letter["sourceOffset"]) == (
        "undecodable",
        b"junk",
        1,
        2,
    )
    assert loop.finished == batch


def test_registry_down_stops_the_worker_and_finishes_nothing() -> None:
    handler, loop, producer, _ = run([b"anything"], codec=RegistryDown())
    assert isinstance(handler.fatal, SchemaRegistryUnavailable)
    assert loop.finished == [] and producer.sent == []
