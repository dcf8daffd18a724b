"""Stand-ins for the Kafka and HTTP shells around a handler: a consumer loop, a producer, a
sender and a config follower, so handlers are driven without a broker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.config import ConfigTable, Destination
from pipeline.core.outcomes import UrlResult
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
    return ConsumedRecord(message, (topic, partition), offset, _Partition())  # type: ignore[arg-type]


@dataclass
class FakeLoop:
    finished: list[ConsumedRecord] = field(default_factory=list)
    deferred: list[tuple[ConsumedRecord, float]] = field(default_factory=list)
    #: Partitions revoked or lost while their records were in flight.
    lost: set[tuple[str, int]] = field(default_factory=set)

    def finish(self, record: ConsumedRecord) -> None:
        whole = record.finished()  # a part of a parked batch: the batch, with its last part
        if whole is not None:
            self.finished.append(whole)

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
        self, records: Sequence[Outgoing], stop: asyncio.Event | None = None
    ) -> None:
        self.sent.extend(records)

    async def send_all(self, records: Sequence[Outgoing]) -> list[Any]:
        self.sent.extend(records)
        return []


@dataclass
class FakeFollower:
    table: ConfigTable


@dataclass
class FakeSender:
    """Answers every attempt with ``answer(destination)``; records what was asked."""

    answer: Callable[[Destination], list[UrlResult]]
    circuits: Callable[[Destination], list[UrlResult] | None] = lambda destination: None
    attempts: list[tuple[str, bytes, str, bool, float]] = field(default_factory=list)
    #: Have a destination's first requests gone unanswered a while (``WebhookSender.unproven``)?
    mute: bool = False

    async def attempt(
        self, destination: Destination, body: bytes, message_id: str = "", *, final: bool = False
    ) -> list[UrlResult]:
        self.attempts.append((destination.id, body, message_id, final, time.time()))
        return self.answer(destination)

    def unproven(self, destination: Destination) -> bool:
        return self.mute

    def silent(self, destination: Destination) -> bool:
        return False

    def silence_ends_in(self, destination: Destination) -> float | None:
        return 3.0 if self.silent(destination) else None

    def rate_wait(self, destination: Destination) -> float:
        return 0.0

    def set_share(self, role: str, share: float) -> None:
        self.share = share

    def reopens_in(self, destination: Destination) -> float | None:
        return 30.0 if self.circuits(destination) else None

    def open_circuits(self, destination: Destination) -> int:
        return 1 if self.circuits(destination) else 0

    def refused_by_circuits(self, destination: Destination) -> list[UrlResult] | None:
        return self.circuits(destination)


class RegistryDown:
    """A codec whose Schema Registry does not answer."""

    def decode(self, name: str, data: bytes | None) -> dict[str, Any]:
        raise SchemaRegistryUnavailable("registry down")

    def encode(self, name: str, record: dict[str, Any]) -> bytes:
        raise AssertionError("nothing to encode")
