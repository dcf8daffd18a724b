"""The Kafka transports: ``Call`` records straight to the calls topic, thread or asyncio.

They write the same Avro ``Call`` records as the ingestion API, so the rest of the pipeline cannot
tell the two apart. They resolve nothing: they need the ``source_id`` the calls belong to (the API
learns it from the write key). Imported only by a client that uses Kafka (``Client(...,
bootstrap_servers=...)``): it loads confluent-kafka and fastavro.

Both decide alike what Kafka's refusals mean (``refused``, on ``pipeline.kafka.errors.Refusal``):
a permanent refusal (too large, not authorised, invalid) is not retried, since the same record
would get the same answer while holding up the queue for ``max_retries`` backoffs; a fatal one
(fenced, out of sequence) replaces the producer before the retry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

from confluent_kafka import Producer

from pipeline.core.exceptions import BrokerUnavailable
from pipeline.core.records import call_to_record
from pipeline.core.settings import Settings
from pipeline.core.timestamps import now_ms
from pipeline.kafka.clients import producer_config, topics_for
from pipeline.kafka.errors import Failed, Headed, Outgoing
from pipeline.kafka.producer import AckedProducer, AsyncProducer
from pipeline.kafka.registry_codec import make_codec

from ._errors import DeliveryError
from ._messages import Queued

__all__ = ["KafkaTransport", "AsyncKafkaTransport", "refused", "kafka_settings"]

P = TypeVar("P", AckedProducer, AsyncProducer)
#: Every record gets its report within message.timeout.ms; this margin covers the rest.
_ACK_MARGIN = 5.0


def kafka_settings(
    bootstrap_servers: str, topic_prefix: str, schema_registry_url: str | None = None
) -> Settings:
    return Settings(
        bootstrap_servers=bootstrap_servers,
        topic_prefix=topic_prefix,
        schema_registry_url=schema_registry_url,
    )


def refused(
    batch: Sequence[Queued], records: Sequence[Outgoing | Headed], failed: Sequence[Failed]
) -> DeliveryError:
    """The ``DeliveryError`` for a batch whose ``failed`` records Kafka refused.

    Retryable only if every refusal is: one permanent refusal gives up the whole rest of the
    batch rather than retry a record that cannot succeed. ``pending`` is the refused calls in
    batch order (the others were delivered), so a retry resends exactly those.
    """
    permanent = [f.refusal for f in failed if not f.refusal.retryable]
    shown = permanent[0] if permanent else failed[0].refusal
    where: dict[bytes | None, list[int]] = {}
    for index, value in enumerate(record[2] for record in records):
        where.setdefault(value, []).append(index)
    # By value: records are matched to calls by their bytes (each holds its own messageId;
    # identical calls are interchangeable, hence the list).
    indices = sorted(where[f.record[2]].pop() for f in failed if where.get(f.record[2]))
    return DeliveryError(
        f"Kafka refused {len(failed)} of {len(batch)} calls: {shown.text}",
        retryable=not permanent,
        pending=[batch[index] for index in indices],
    )


class _KafkaRecords:
    """What both Kafka transports share: their settings and producer config, and the turning of
    queued messages into (topic, key, Avro value), stamped with the time they are written."""

    def __init__(
        self,
        bootstrap_servers: str,
        source_id: str,
        topic_prefix: str,
        timeout: float,
        config: Mapping[str, Any] | None,
        schema_registry_url: str | None,
    ) -> None:
        self.settings = kafka_settings(bootstrap_servers, topic_prefix, schema_registry_url)
        self.overrides = {"message.timeout.ms": max(1000, int(timeout * 1000)), **(config or {})}
        self.producer_config = producer_config(self.settings, **self.overrides)
        self.topic = topics_for(self.settings).calls
        self.source_id = source_id
        self.codec = make_codec(self.settings)  # Confluent wire format when a registry is set

    def records(self, batch: Sequence[Queued]) -> list[Outgoing | Headed]:
        """Each call's record, with the trace context it was made in (if any) as headers."""
        now = now_ms()
        encode = self.codec.encode
        out: list[Outgoing | Headed] = []
        for item in batch:
            call = item.call
            record = call_to_record(call)
            record["sourceId"] = self.source_id
            record["receivedAt"] = record["sentAt"] = now
            value = encode("Call", record)
            out.append(
                (self.topic, call.key, value, list(item.trace))
                if item.trace
                else (self.topic, call.key, value)
            )
        return out


class _KafkaTransport(Generic[P]):
    """Both transports' construction: the records, and a producer made at once."""

    def __init__(
        self,
        bootstrap_servers: str,
        source_id: str,
        *,
        topic_prefix: str = "",
        timeout: float = 10.0,
        config: Mapping[str, Any] | None = None,
        schema_registry_url: str | None = None,
    ) -> None:
        self._records = _KafkaRecords(
            bootstrap_servers, source_id, topic_prefix, timeout, config, schema_registry_url
        )
        self._timeout = timeout
        # Made now, not on the first send: an idempotent producer needs a moment to get its
        # producer id, and a first send that waits for it lets the queue fill meanwhile.
        self._producer: P | None = self._make_producer()

    def _make_producer(self) -> P:
        raise NotImplementedError


class KafkaTransport(_KafkaTransport[AckedProducer]):
    """Writes ``Call`` records to the calls topic (idempotent producer, ``acks=all``), with
    ``AckedProducer``.

    ``timeout`` bounds one ``send``: librdkafka retries by itself until then, and reports every
    record that is still unacknowledged as failed, so a retry resends exactly those.
    """

    def _make_producer(self) -> AckedProducer:
        return AckedProducer(
            self._records.settings,
            buffer_timeout=self._timeout + _ACK_MARGIN,
            config=self._records.overrides,
        )

    def send(self, batch: Sequence[Queued]) -> None:
        producer = self._producer = self._producer or self._make_producer()
        records = self._records.records(batch)
        producer.reset_counts()  # this batch's answers only
        unanswered = 0
        try:
            for record in records:
                headers = record[3] if len(record) == 4 else ()
                producer.produce(record[0], record[1], record[2], headers=headers)
            producer.flush(self._timeout + _ACK_MARGIN)
        except BrokerUnavailable:  # no room in librdkafka's queue, or answers missing
            unanswered = len(records) - producer.acks.answered
        failed = list(producer.failed)
        if any(failure.refusal.fatal for failure in failed):
            producer.replace()  # fenced: the retry goes through a new producer
        if unanswered:
            raise DeliveryError(
                f"Kafka did not acknowledge {unanswered} of {len(batch)} calls in time",
                retryable=True,
            )
        if failed:
            raise refused(batch, records, failed)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(self._timeout)
            self._producer = None


class AsyncKafkaTransport(_KafkaTransport[AsyncProducer]):
    """The asyncio twin of ``KafkaTransport``, on ``pipeline``'s ``AsyncProducer``."""

    def _make_producer(self) -> AsyncProducer:
        records = self._records
        return AsyncProducer(records.settings, producer=Producer(dict(records.producer_config)))

    async def send(self, batch: Sequence[Queued]) -> None:
        if self._producer is None:
            self._producer = self._make_producer()
        if self._records.settings.schema_registry_url:  # encoding may ask the registry: off loop
            records = await asyncio.to_thread(self._records.records, batch)
        else:
            records = self._records.records(batch)
        failed = await self._producer.send_all(records)
        if not failed:
            return
        if any(failure.refusal.fatal for failure in failed):
            broken, self._producer = self._producer, None  # fenced: the next try gets a new one
            await asyncio.to_thread(broken.close, 0.0)
        raise refused(batch, records, failed)

    async def aclose(self) -> None:
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await asyncio.to_thread(producer.close, self._timeout)
