"""Both Kafka transports read Kafka's refusals alike (``_kafka.refused``).

The broker used by the integration tests cannot be made to refuse a record for its size, so these
drive the transports with a stand-in for librdkafka's producer that refuses the records it is
told to, with librdkafka's own error codes. No network.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from confluent_kafka import KafkaError

from pipeline.client import AsyncClient, DeliveryError
from pipeline.client._kafka import AsyncKafkaTransport, KafkaTransport
from pipeline.client._messages import Queued, build_message, prepare
from pipeline.kafka import producer as producer_module
from pipeline.kafka.errors import Failed, Outgoing, Refusal

TOO_LARGE = KafkaError.MSG_SIZE_TOO_LARGE
FENCED = KafkaError.PRODUCER_FENCED
TIMED_OUT = KafkaError._MSG_TIMED_OUT


def calls(count: int) -> list[Queued]:
    return [
        prepare(
            build_message("track", user_id=f"u{n}", event="E"),
            event_time=0,
            source_id="src",
            keep_call=True,
        )
        for n in range(count)
    ]


class Message:
    def __init__(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        self._record = (topic, key, value)

    def topic(self) -> str:
        return self._record[0]

    def key(self) -> bytes | None:
        return self._record[1]

    def value(self) -> bytes | None:
        return self._record[2]

    def headers(self) -> None:
        return None  # as confluent-kafka's Message of a record produced without headers

    def partition(self) -> int | None:
        return None  # as confluent-kafka's of a record refused before librdkafka placed it


class FakeProducer:
    """confluent-kafka's ``Producer`` as ``AckedProducer`` uses it; refuses by record number."""

    made: list[FakeProducer] = []
    refuse: dict[int, int] = {}  # the n-th record produced (on any producer) -> error code
    unanswered = 0  # records ``flush`` leaves without a report

    def __init__(self, _config: dict[str, Any]) -> None:
        self.reports: list[tuple[Any, Message]] = []
        FakeProducer.made.append(self)

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Any) -> None:
        self.reports.append((on_delivery, Message(topic, key, value)))

    def poll(self, _timeout: float) -> int:
        return 0

    def flush(self, _timeout: float) -> int:
        answered = self.reports[: len(self.reports) - FakeProducer.unanswered]
        for number, (report, message) in enumerate(answered):
            code = FakeProducer.refuse.get(number)
            report(None if code is None else KafkaError(code), message)
        self.reports.clear()
        return FakeProducer.unanswered


@pytest.fixture
def fake_kafka(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[FakeProducer]]:
    monkeypatch.setattr(producer_module, "Producer", FakeProducer)
    monkeypatch.setattr(FakeProducer, "made", [])
    monkeypatch.setattr(FakeProducer, "refuse", {})
    monkeypatch.setattr(FakeProducer, "unanswered", 0)
    yield FakeProducer


class FakeAsyncProducer:
    """``AsyncProducer.send_all``: refuses the records whose number is in ``refuse``."""

    def __init__(self, refuse: dict[int, int]) -> None:
        self.refuse = refuse
        self.sends = 0
        self.closed = False

    async def send_all(self, records: Sequence[Outgoing]) -> list[Failed]:
        self.sends += 1
        return [
            Failed(record, Refusal(self.refuse[n], KafkaError(self.refuse[n]).str()))
            for n, record in enumerate(records)
            if n in self.refuse
        ]

    def close(self, _timeout: float = 10.0) -> int:
        self.closed = True
        return 0


def async_transport(
    monkeypatch: pytest.MonkeyPatch, *producers: FakeAsyncProducer
) -> AsyncKafkaTransport:
    made = iter(producers)
    monkeypatch.setattr(AsyncKafkaTransport, "_make_producer", lambda self: next(made))
    return AsyncKafkaTransport("127.0.0.1:1", "src")


# ---- the thread transport (on AckedProducer) ----------------------------------------------------


def test_the_sync_transport_gives_up_on_a_permanent_refusal(fake_kafka) -> None:
    fake_kafka.refuse = {1: TOO_LARGE}
    batch = calls(3)
    with pytest.raises(DeliveryError) as raised:
        KafkaTransport("127.0.0.1:1", "src").send(batch)
    assert raised.value.retryable is False
    assert raised.value.pending == [batch[1]]  # the others were delivered
    assert str(raised.value).startswith("Kafka refused 1 of 3 calls: ")


def test_the_sync_transport_retries_a_transient_refusal_and_replaces_a_fenced_producer(
    fake_kafka,
) -> None:
    transport = KafkaTransport("127.0.0.1:1", "src")
    batch = calls(3)
    fake_kafka.refuse = {0: TIMED_OUT, 2: FENCED}
    with pytest.raises(DeliveryError) as raised:
        transport.send(batch)
    assert raised.value.retryable is True and raised.value.pending == [batch[0], batch[2]]
    assert len(fake_kafka.made) == 2  # fenced: the next try goes through a new producer
    fake_kafka.refuse = {}
    transport.send(batch[:2])  # each send counts its own answers only
    transport.close()


def test_the_sync_transport_retries_the_whole_batch_when_answers_are_missing(fake_kafka) -> None:
    fake_kafka.unanswered = 1
    with pytest.raises(DeliveryError, match="did not acknowledge 1 of 2 calls in time") as raised:
        KafkaTransport("127.0.0.1:1", "src", timeout=1.0).send(calls(2))
    assert raised.value.retryable is True and raised.value.pending is None


# ---- the asyncio transport ----------------------------------------------------------------------


def test_the_async_transport_gives_up_on_a_permanent_refusal(monkeypatch) -> None:
    # Before the shared classifier it called every refusal retryable, MSG_SIZE_TOO_LARGE too.
    transport = async_transport(monkeypatch, FakeAsyncProducer({1: TOO_LARGE, 2: TIMED_OUT}))
    batch = calls(3)
    with pytest.raises(DeliveryError) as raised:
        asyncio.run(transport.send(batch))
    assert raised.value.retryable is False
    assert raised.value.pending == [batch[1], batch[2]]
    assert "Broker: Message size too large" in str(raised.value)


def test_the_async_transport_replaces_a_fenced_producer(monkeypatch) -> None:
    fenced, fresh = FakeAsyncProducer({0: FENCED}), FakeAsyncProducer({})
    transport = async_transport(monkeypatch, fenced, fresh)
    batch = calls(2)

    async def main() -> None:
        with pytest.raises(DeliveryError) as raised:
            await transport.send(batch)
        assert raised.value.retryable is True and raised.value.pending == [batch[0]]
        await transport.send(batch[:1])

    asyncio.run(main())
    assert fenced.closed and (fenced.sends, fresh.sends) == (1, 1)


def test_the_async_client_does_not_retry_a_permanent_refusal(monkeypatch) -> None:
    producer = FakeAsyncProducer({0: TOO_LARGE})
    transport = async_transport(monkeypatch, producer)
    errors: list[Exception] = []

    async def main() -> tuple[bool, int]:
        async with AsyncClient(
            "",
            bootstrap_servers="127.0.0.1:1",
            source_id="src",
            transport=transport,
            on_error=lambda error, _messages: errors.append(error),
        ) as client:
            client.track("u1", "Too Large")
            flushed = await client.flush(timeout=5)
            return flushed, client.failed

    assert asyncio.run(main()) == (False, 1)
    assert producer.sends == 1  # given up at once, not after max_retries backoffs
    assert isinstance(errors[0], DeliveryError) and not errors[0].retryable
