"""The router role: ``calls`` → one delivery record per enabled destination.

The body is rendered here, once per call, so every retry sends the same bytes. A batch is finished
only after Kafka acknowledged every delivery record it produced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from pipeline.core.calls import Call, CallType
from pipeline.core.outcomes import DeadLetterReason
from pipeline.core.records import call_from_record, dead_letter_to_record, delivery_to_record
from pipeline.core.routing import DropReason, route_record
from pipeline.core.topics import Topics
from pipeline.kafka.codec import Codec, RecordCodec
from pipeline.kafka.config_store import ConfigFollower
from pipeline.kafka.consumer_loop import ConsumerLoop, Taken
from pipeline.kafka.producer import AsyncProducer, Outgoing
from pipeline.kafka.registry_codec import SchemaRegistryUnavailable
from pipeline.roles.deliver import letter_of
from pipeline.runtime import metrics

__all__ = ["RouterHandler"]


class RouterHandler:
    role = "router"

    def __init__(
        self,
        *,
        topics: Topics,
        follower: ConfigFollower,
        producer: AsyncProducer,
        stop: asyncio.Event,
        codec: RecordCodec | None = None,
    ) -> None:
        self._topics = topics
        self._follower = follower
        self._producer = producer
        self._stop = stop
        self._codec: RecordCodec = codec or Codec.default()
        #: Set when the pipeline cannot go on (the Schema Registry is down): the worker stops.
        self.fatal: BaseException | None = None
        self._routed = {t: metrics.CALLS_ROUTED.labels(t.value) for t in CallType}
        self._dropped = {r: metrics.CALLS_DROPPED.labels(r.value) for r in DropReason}

    def topics(self) -> Sequence[str]:
        return [self._topics.calls]

    async def handle(self, batch: list[Taken], loop: ConsumerLoop) -> None:
        out = self._route(batch)
        if out is None:
            return
        metrics.DELIVERIES_ROUTED.inc(len(out))
        await self._producer.send_all_until_acked(out, self._stop)
        for taken in batch:
            loop.finish(taken)

    def _decode(self, data: bytes | None) -> Call:
        return call_from_record(self._codec.decode("Call", data))

    def _route(self, batch: list[Taken]) -> list[Outgoing] | None:
        """The records to produce for ``batch``; ``None`` when the worker must stop."""
        table = self._follower.table
        codec = self._codec
        decode = self._decode
        deliveries_topic = self._topics.deliveries
        out: list[Outgoing] = []
        # Counted per batch, not per call (a lock each), before anything is produced.
        routed: dict[CallType, int] = {}
        dropped: dict[DropReason, int] = {}
        try:
            for taken in batch:
                try:
                    decision = route_record(taken.message.value(), decode, table)
                except SchemaRegistryUnavailable as exc:
                    # Not the record's fault: stop without finishing it; a restart picks it up.
                    self.fatal = exc
                    self._stop.set()
                    return None
                if decision.call_type is None:
                    undecodable = DeadLetterReason.UNDECODABLE
                    letter = letter_of(undecodable, taken, detail=decision.undecodable or "")
                    metrics.DEAD_LETTERS.labels(undecodable.value).inc()
                    value = codec.encode("DeadLetter", dead_letter_to_record(letter))
                    out.append((self._topics.dlq, None, value))
                    continue
                routed[decision.call_type] = routed.get(decision.call_type, 0) + 1
                if decision.dropped is not None:
                    dropped[decision.dropped] = dropped.get(decision.dropped, 0) + 1
                    continue
                for key, delivery in decision.deliveries:
                    value = codec.encode("Delivery", delivery_to_record(delivery))
                    out.append((deliveries_topic, key, value))
        finally:
            for call_type, count in routed.items():
                self._routed[call_type].inc(count)
            for reason, count in dropped.items():
                self._dropped[reason].inc(count)
        return out

    async def aclose(self) -> None:
        return None
