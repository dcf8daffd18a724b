"""The delivery handler suppresses what a deletion request covers, driven without a broker."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from prometheus_client import REGISTRY

from pipeline.core.config import ConfigTable, Destination, Source
from pipeline.core.outcomes import UrlResult
from pipeline.core.records import Delivery, delivery_to_record
from pipeline.core.settings import Settings
from pipeline.core.topics import Topics
from pipeline.kafka.codec import Codec
from pipeline.kafka.log_reading import decode_log_records
from pipeline.roles.deliver import DeliveryHandler
from tests.unit.roles._fakes import (
    FakeFollower,
    FakeLoop,
    FakeProducer,
    FakeSender,
    health_of,
    taken,
)

TOPICS = Topics("t.", retry_tiers=2)
CODEC = Codec.default()
URL = "https://a.example/h"
TABLE = ConfigTable.build(
    [Source(id="web", write_keys=["wk"])],
    [Destination(id="sup", sources=["web"], webhooks=[{"url": URL}])],
)
NOW_MS = int(time.time() * 1000)


def record(message_id: str, **changes: Any) -> bytes:
    fresh = Delivery(message_id, "sup", "web", "track", b"{}", NOW_MS - 60_000, user_id="gone")
    return CODEC.encode("Delivery", delivery_to_record(fresh._replace(**changes)))


def handle(values: list[bytes], deleted: dict[str, int]) -> tuple[FakeSender, FakeLoop, Any]:
    sender, loop, producer = FakeSender(lambda d: [UrlResult(URL, 200)]), FakeLoop(), FakeProducer()
    batch = [taken(TOPICS.deliveries, v, offset=i) for i, v in enumerate(values)]

    async def go() -> None:
        handler = DeliveryHandler(
            "deliver",
            [TOPICS.deliveries],
            settings=Settings(),
            topics=TOPICS,
            follower=FakeFollower(TABLE),
            producer=producer,
            sender=sender,
            health=health_of(),
            stop=asyncio.Event(),
            codec=CODEC,
            deleted=deleted,
        )
        await handler.handle(batch, loop)
        while handler._tasks:
            await handler.aclose()

    asyncio.run(go())
    assert loop.finished == batch  # every record finished, suppressed or delivered
    return sender, loop, producer


def logged(producer: Any) -> dict[str, list[str]]:
    kinds: dict[str, list[str]] = {}
    for topic, _key, value, *_ in producer.sent:
        assert topic == TOPICS.log  # a suppressed record hands nothing else off
        for log_record in decode_log_records(CODEC, value):
            kinds[log_record["messageId"]] = [e["kind"] for e in log_record["entries"]]
    return kinds


def suppressed_count() -> float:
    return REGISTRY.get_sample_value("pipeline_suppressed_total", {"destination": "sup"}) or 0.0


def test_a_call_received_before_the_users_deletion_is_suppressed_and_logged() -> None:
    before = suppressed_count()
    sender, _, producer = handle(
        [
            record("old", tier=1),  # waiting in a retry tier when the request came
            record("new", received_at=NOW_MS),  # the user came back after the request
            record("other", user_id="stays"),
            record("delete", call_type="delete"),  # the request's own notification
        ],
        {"gone": NOW_MS - 1_000},
    )
    assert sorted(mid for _, _, mid, _, _ in sender.attempts) == ["delete", "new", "other"]
    assert logged(producer)["old"] == ["suppressed"]
    assert suppressed_count() == before + 1


def test_without_deletion_requests_nothing_is_suppressed() -> None:
    sender, _, _ = handle([record("old")], {})
    assert [mid for _, _, mid, _, _ in sender.attempts] == ["old"]
