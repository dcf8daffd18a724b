"""Stand-ins for the Kafka and HTTP shells around a handler: a consumer loop, a producer, a
sender and a config follower, so handlers are driven without a broker; and the real endpoint
health (pure logic) on a clock the test moves."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.config import ConfigTable, Destination
from pipeline.core.endpoint_health import EndpointHealth
from pipeline.core.outcomes import Failure, UrlResult
from pipeline.core.settings import Settings
from pipeline.kafka.consumer_loop import ConsumedRecord, _Partition
from pipeline.kafka.producer import Outgoing
from pipeline.kafka.registry_codec import SchemaRegistryUnavailable


class FakeMessage:
    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]] | None = None,
    ):
        self._where = (topic, partition, offset)
        self._key, self._value, self._headers = key, value, headers

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (0, -1)

    def topic(self) -> str:
        return self._where[0]

    def partition(self) -> int:
        return self._where[1]

    def offset(self) -> int:
        return self._where[2]

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value


def taken(
    topic: str,
    value: bytes | None,
    *,
    key: bytes | None = b"k",
    partition: int = 0,
    offset: int = 0,
    headers: list[tuple[str, bytes]] | None = None,
) -> ConsumedRecord:
    message = FakeMessage(topic, partition, offset, key, value, headers)
    return ConsumedRecord(message, (topic, partition), offset, _Partition())


@dataclass
class FakeLoop:
    finished: list[ConsumedRecord] = field(default_factory=list)
    deferred: list[tuple[ConsumedRecord, float]] = field(default_factory=list)
    #: Records whose work was done, then only Kafka's acknowledgements awaited.
    concluded_records: list[ConsumedRecord] = field(default_factory=list)
    #: Partitions revoked or lost while their records were in flight.
    lost: set[tuple[str, int]] = field(default_factory=set)

    def finish(self, record: ConsumedRecord) -> None:
        whole = record.finished()  # a part of a parked batch: the batch, with its last part
        if whole is not None:
            self.finished.append(whole)

    def concluded(self, record: ConsumedRecord) -> None:
        assert record not in self.finished, "concluded once finished"
        self.concluded_records.append(record)

    def owns(self, record: ConsumedRecord) -> bool:
        return record.key not in self.lost

    def group_metadata(self) -> str:
        return "group-metadata"

    def defer(self, record: ConsumedRecord, until: float) -> None:
        self.deferred.append((record, until))


@dataclass
class FakeProducer:
    sent: list[Outgoing] = field(default_factory=list)

    async def send_all_until_acked(
        self,
        records: Sequence[Outgoing],
        stop: asyncio.Event | None = None,
        *,
        ends: dict[tuple[str, int], int] | None = None,
    ) -> None:
        self.sent.extend(records)
        if ends is not None:  # offsets as a broker would give them: one partition's in a row
            for record in records:
                if len(record) == 5:
                    where = (record[0], record[4])
                    ends[where] = (
                        sum(1 for r in self.sent if r[0] == where[0] and r[4:] == (where[1],)) - 1
                    )

    async def send_all(self, records: Sequence[Outgoing]) -> list[Any]:
        self.sent.extend(records)
        return []


@dataclass
class FakeFollower:
    table: ConfigTable


@dataclass
class FakeSender:
    """Answers every attempt with ``answer(destination)``, ``delay`` seconds after it started;
    records what was asked."""

    answer: Callable[[Destination], list[UrlResult]]
    attempts: list[tuple[str, bytes, str, bool, float]] = field(default_factory=list)
    delay: float = 0.0
    #: Each attempt's trace context.
    traces: list[list[tuple[str, bytes]]] = field(default_factory=list)

    async def attempt(
        self,
        destination: Destination,
        body: bytes,
        message_id: str = "",
        *,
        final: bool = False,
        turn: float | None = None,
        trace: Sequence[tuple[str, bytes]] = (),
        resends: int = 0,
    ) -> list[UrlResult]:
        self.traces.append(list(trace))
        if turn is not None and turn > time.monotonic():  # its turn under the pace, as sent
            await asyncio.sleep(turn - time.monotonic())
        self.attempts.append((destination.id, body, message_id, final, time.time()))
        if self.delay:
            await asyncio.sleep(self.delay)
        return self.answer(destination)


class Clock:
    """A monotonic clock a test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def health_of(settings: Settings | None = None, clock: Clock | None = None) -> EndpointHealth:
    """The real endpoint health (pure logic), on a clock the test moves."""
    return EndpointHealth(settings or Settings(), clock=clock or Clock())


def open_circuit(health: EndpointHealth, url: str, failures: int = 5) -> None:
    """Fail ``url`` ``failures`` times in a row: its circuit opens (``circuit_failures``)."""
    endpoint = health.endpoint(url)
    for _ in range(failures):
        health.started(endpoint)
        health.ended(endpoint, UrlResult(url, 503, Failure.SERVER_ERROR, "503"))


def request_out(health: EndpointHealth, clock: Clock, url: str, seconds: float) -> None:
    """A request to ``url`` out and unanswered for ``seconds`` (unproven past 0.05 s, silent
    past 0.25 s)."""
    health.started(health.endpoint(url))
    clock.now += seconds


class RegistryDown:
    """A codec whose Schema Registry does not answer."""

    def decode(self, name: str, data: bytes | None) -> dict[str, Any]:
        raise SchemaRegistryUnavailable("registry down")

    def encode(self, name: str, record: dict[str, Any]) -> bytes:
        raise AssertionError("nothing to encode")
