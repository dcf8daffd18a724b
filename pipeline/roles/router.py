"""The router role: ``calls`` → one delivery record per enabled destination.

The body is rendered here, once per call, so every retry sends the same bytes. A batch is finished
only after Kafka acknowledged every delivery record it produced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from pipeline.core.calls import CallType
from pipeline.core.dead_letters import dead_letter
from pipeline.core.exceptions import UndecodableRecord
from pipeline.core.outcomes import DeadLetterReason
from pipeline.core.records import call_from_record, new_delivery
from pipeline.core.render import render_body
from pipeline.core.routing import DropReason, route
from pipeline.core.topics import Topics
from pipeline.kafka.codec import Codec, RecordCodec
from pipeline.kafka.config_store import ConfigFollower
from pipeline.kafka.consumer_loop import ConsumerLoop, Taken
from pipeline.kafka.producer import AsyncProducer, Outgoing
from pipeline.kafka.registry_codec import SchemaRegistryUnavailable
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

    def _route(self, batch: list[Taken]) -> list[Outgoing] | None:
        """The records to produce for ``batch``; ``None`` when the worker must stop."""
        table = self._follower.table
        codec = self._codec
        deliveries_topic = self._topics.deliveries
        out: list[Outgoing] = []
        # Counted per batch, not per call (a lock each), before anything is produced.
        routed: dict[CallType, int] = {}
        dropped: dict[DropReason, int] = {}
        try:
            for taken in batch:
                message = taken.message
                try:
                    call = call_from_record(codec.decode("Call", message.value()))
                except SchemaRegistryUnavailable as exc:
                    # Not the record's fault: stop without finishing it; a restart picks it up.
                    self.fatal = exc
                    self._stop.set()
                    return None
                except (UndecodableRecord, KeyError, ValueError) as exc:
                    letter = dead_letter(DeadLetterReason.UNDECODABLE, message, detail=str(exc))
                    metrics.DEAD_LETTERS.labels(DeadLetterReason.UNDECODABLE.value).inc()
                    out.append((self._topics.dlq, None, codec.encode("DeadLetter", letter)))
                    continue
                routed[call.type] = routed.get(call.type, 0) + 1
                decision = route(call, table)
                if decision.dropped is not None:
                    dropped[decision.dropped] = dropped.get(decision.dropped, 0) + 1
                    continue
                body = render_body(call)
                user_key = call.key
                for destination in decision.destinations:
                    record = codec.encode("Delivery", new_delivery(call, destination.id, body))
                    # One destination's traffic spreads over partitions; one user's calls to one
                    # destination stay in one partition, in order.
                    out.append(
                        (deliveries_topic, destination.id.encode() + b"/" + user_key, record)
                    )
        finally:
            for call_type, count in routed.items():
                self._routed[call_type].inc(count)
            for reason, count in dropped.items():
                self._dropped[reason].inc(count)
        return out

    async def aclose(self) -> None:
        return None
