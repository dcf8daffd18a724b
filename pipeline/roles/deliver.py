"""The delivery handler: attempt a delivery record, then hand it on by outcome.

The same handler serves the ``deliver`` role (main topic) and the ``retry`` role (the tier topics);
a record due later (``notBefore``) waits, in memory or in its paused partition (step 0).

For each record:

0. Not due yet (``notBefore``): due within ``HOLD_SECONDS`` → held here until it is; later → the
   consumer loop pauses the partition until ``HOLD_SECONDS`` before it is due.
1. Look the destination up in the live config (deleted → dead letter, disabled → dead letter).
2. Past the deadline → dead letter ``deadline_exceeded`` without an attempt.
3. POST to every webhook at once and combine the answers (``pipeline.core.outcomes.decide``).
4. Delivered → finished. Retry → the next tier with its ``notBefore`` (``RetrySchedule``), or the
   dead-letter topic when the deadline leaves no room. Permanent failure → dead letter.
5. The record is finished only after Kafka acknowledged the hand-off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

from pipeline.core.config import Destination
from pipeline.core.dead_letters import dead_letter
from pipeline.core.exceptions import UndecodableRecord
from pipeline.core.outcomes import DeadLetterReason, Failure, Outcome, UrlResult, decide
from pipeline.core.retry_schedule import RetrySchedule
from pipeline.core.settings import Settings
from pipeline.core.topics import Topics
from pipeline.http.sender import WebhookSender
from pipeline.kafka.codec import Codec, RecordCodec
from pipeline.kafka.config_store import ConfigFollower
from pipeline.kafka.consumer_loop import ConsumerLoop, Taken
from pipeline.kafka.producer import AsyncProducer, Outgoing
from pipeline.kafka.registry_codec import SchemaRegistryUnavailable
from pipeline.runtime import metrics

__all__ = ["DeliveryHandler", "HOLD_SECONDS"]
log = logging.getLogger("pipeline.deliver")

#: A record due within this many seconds is held in memory (it counts against the in-flight
#: limit) and attempted at its ``notBefore``; one due later pauses its partition until this long
#: before it is due. Pausing and resuming a partition costs a fetch round trip (50-500 ms), so
#: pausing alone made every retry that late.
HOLD_SECONDS = 1.0


class DeliveryHandler:
    def __init__(
        self,
        role: str,
        topics_in: Sequence[str],
        *,
        settings: Settings,
        topics: Topics,
        follower: ConfigFollower,
        producer: AsyncProducer,
        sender: WebhookSender,
        stop: asyncio.Event,
        codec: RecordCodec | None = None,
        schedule: RetrySchedule | None = None,
    ) -> None:
        self.role = role
        self._topics_in = list(topics_in)
        self._topics = topics
        self._follower = follower
        self._producer = producer
        self._sender = sender
        self._stop = stop
        self._codec: RecordCodec = codec or Codec.default()
        #: Set when the pipeline cannot go on (the Schema Registry is down): the worker stops.
        self.fatal: BaseException | None = None
        self._schedule = schedule or RetrySchedule(settings.retry_delays, settings.retry_deadline)
        self._tasks: set[asyncio.Task[None]] = set()
        self._outcomes = {o: metrics.DELIVERIES.labels(o.value) for o in Outcome}
        self._retries = [metrics.RETRIES.labels(str(t)) for t in range(len(topics.retry))]

    def topics(self) -> Sequence[str]:
        return self._topics_in

    async def handle(self, batch: list[Taken], loop: ConsumerLoop) -> None:
        now = time.time()
        deferred: set[tuple[str, int]] = set()
        # Records decided without a request (undecodable, destination gone, deadline passed,
        # every circuit open) are handed off together: one produce and one wait for the batch,
        # not a task, a future and a wake-up each. A hanging destination's records take this path
        # once its circuit is open, so they cost its healthy neighbours little.
        decided: list[tuple[Taken, list[Outgoing]]] = []
        held: list[tuple[float, Taken, dict[str, Any]]] = []
        try:
            for taken in batch:
                message = taken.message
                key = taken.key
                if key in deferred:
                    continue  # the loop sought back; these come again after the pause
                try:
                    record = self._codec.decode("Delivery", message.value())
                except UndecodableRecord as exc:
                    letter = dead_letter(DeadLetterReason.UNDECODABLE, message, detail=str(exc))
                    decided.append((taken, [self._dlq(letter)]))
                    continue
                not_before = record["notBefore"] / 1000
                if not_before > now:
                    if not_before - now <= HOLD_SECONDS:
                        held.append((not_before, taken, record))
                        continue
                    # Pause the partition; resume a little early so the head is then held here
                    # and attempted on time (a resume costs a fetch round trip).
                    loop.defer(taken, not_before - HOLD_SECONDS)
                    deferred.add(key)
                    continue
                self._start(taken, record, loop, now, decided)
        except SchemaRegistryUnavailable as exc:
            self._give_up(exc)  # nothing of this batch is finished: a restart delivers it
            return
        if decided:
            self._spawn(self._hand_off_all(decided, loop))
        if held:  # one task for the batch's held records, not a task and a timer each
            self._spawn(self._start_when_due(held, loop))

    def _start(
        self,
        taken: Taken,
        record: dict[str, Any],
        loop: ConsumerLoop,
        now: float,
        decided: list[tuple[Taken, list[Outgoing]]],
    ) -> None:
        """A due record: decided without a request (appended to ``decided``), or a request's
        task started. Raises ``SchemaRegistryUnavailable`` (the caller stops the worker)."""
        try:
            before = self._before_attempt(taken, record, now)
        except SchemaRegistryUnavailable:
            raise
        except Exception as exc:  # a bug must neither lose the record nor stall it
            before = self._internal_error(taken, record, exc)
        if isinstance(before, list):
            decided.append((taken, before))
        else:
            destination, final = before
            self._spawn(self._process(taken, record, loop, destination, final, now))

    async def _start_when_due(
        self, held: list[tuple[float, Taken, dict[str, Any]]], loop: ConsumerLoop
    ) -> None:
        """Start each held record at its ``notBefore``, never before; those due together are
        decided together (one hand-off)."""
        held.sort(key=itemgetter(0))  # by due time; stable: a partition's records keep their order
        index = 0
        while index < len(held):
            while (wait := held[index][0] - time.time()) > 0:  # never early, whatever the timer
                await asyncio.sleep(wait)
            now = time.time()
            decided: list[tuple[Taken, list[Outgoing]]] = []
            try:
                while index < len(held) and held[index][0] <= now:
                    _, taken, record = held[index]
                    index += 1
                    self._start(taken, record, loop, now, decided)
            except SchemaRegistryUnavailable as exc:
                self._give_up(exc)  # what is not finished is delivered after a restart
                return
            if decided:
                self._spawn(self._hand_off_all(decided, loop))

    def _give_up(self, exc: BaseException) -> None:
        """Not a record's fault (the Schema Registry is down): stop the worker, finish nothing."""
        if self.fatal is None:
            log.error("%s: stopping: %s", self.role, exc)
        self.fatal = exc
        self._stop.set()

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aclose(self) -> None:
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)

    def _dlq(self, letter: dict[str, Any]) -> Outgoing:
        metrics.DEAD_LETTERS.labels(letter["reason"]).inc()
        key = (letter["delivery"] or {}).get("destinationId", "").encode() or None
        return (self._topics.dlq, key, self._codec.encode("DeadLetter", letter))

    async def _hand_off_all(
        self, decided: list[tuple[Taken, list[Outgoing]]], loop: ConsumerLoop
    ) -> None:
        records = [record for _, out in decided for record in out]
        await self._producer.send_all_until_acked(records, self._stop)
        for taken, _ in decided:
            loop.finish(taken)

    def _internal_error(
        self, taken: Taken, record: dict[str, Any], exc: Exception
    ) -> list[Outgoing]:
        """The dead letter of a record a bug stopped (called in the ``except`` block)."""
        log.exception("%s: unexpected error on %s", self.role, record.get("messageId"))
        letter = dead_letter(
            DeadLetterReason.INTERNAL_ERROR,
            taken.message,
            delivery=record,
            detail=f"{type(exc).__name__}: {exc}",
        )
        return [self._dlq(letter)]

    async def _process(
        self,
        taken: Taken,
        record: dict[str, Any],
        loop: ConsumerLoop,
        destination: Destination,
        final: bool,
        now: float,
    ) -> None:
        """Steps 3 to 5 for a record ``_before_attempt`` (at ``now``) cleared for a request."""
        try:
            results = await self._sender.attempt(
                destination, record["body"], record["messageId"], final=final
            )
            out = self._conclude(taken, record, results, now, time.time())
        except SchemaRegistryUnavailable as exc:
            self._give_up(exc)  # the record stays unfinished: a restart delivers it
            return
        except Exception as exc:  # a bug must neither lose the record nor stall the partition
            out = self._internal_error(taken, record, exc)
        if out:
            await self._producer.send_all_until_acked(out, self._stop)
        loop.finish(taken)

    def _before_attempt(
        self, taken: Taken, record: dict[str, Any], now: float
    ) -> tuple[Destination, bool] | list[Outgoing]:
        """Steps 1 and 2, and the circuits: the destination and whether this is the record's final
        attempt, or the hand-off when no request is to be made (dead letter; next tier when every
        webhook's circuit is open)."""
        message = taken.message
        destination = self._follower.table.destinations.get(record["destinationId"])
        if destination is None or not destination.enabled:
            reason = (
                DeadLetterReason.DESTINATION_DELETED
                if destination is None
                else DeadLetterReason.DESTINATION_DISABLED
            )
            self._outcomes[Outcome.DEAD_LETTER].inc()
            return [self._dlq(dead_letter(reason, message, delivery=record))]

        first = record["firstAttemptAt"]
        if first is not None and not self._schedule.may_attempt(
            first_attempt_at=first / 1000, now=now
        ):
            self._outcomes[Outcome.DEAD_LETTER].inc()
            detail = "the deadline passed before this attempt could start"
            return [
                self._dlq(
                    dead_letter(
                        DeadLetterReason.DEADLINE_EXCEEDED, message, delivery=record, detail=detail
                    )
                )
            ]
        if first is None:
            record["firstAttemptAt"] = first = int(now * 1000)
            record["deadline"] = int(self._schedule.deadline_at(now) * 1000)

        # The last slot before the deadline is a record's final chance: it is always tried, even
        # through an open circuit (which would otherwise dead-letter it without a request).
        final = now >= self._schedule.last_slot(first / 1000)
        if not final:
            refused = self._sender.refused_by_circuits(destination)
            if refused is not None:
                return self._conclude(taken, record, refused, now, now)
        return destination, final

    def _conclude(
        self,
        taken: Taken,
        record: dict[str, Any],
        results: Sequence[UrlResult],
        now: float,
        finished: float,
    ) -> list[Outgoing]:
        """Steps 3 and 4 after the attempt (begun at ``now``): the hand-off by outcome.

        Results that are all ``circuit_open`` (known before, or once a connection slot was free)
        mean no request was made: no attempt to time.
        """
        message = taken.message
        first = record["firstAttemptAt"]
        decision = decide(results)
        if not all(result.failure is Failure.CIRCUIT_OPEN for result in results):
            metrics.DELIVERY_ATTEMPT_SECONDS.observe(finished - now)

        if decision.outcome is Outcome.DELIVERED:
            self._outcomes[Outcome.DELIVERED].inc()
            metrics.END_TO_END_SECONDS.observe(max(0.0, finished - record["receivedAt"] / 1000))
            return []  # a delivered record is not kept, so neither is its attempt history
        record["attempts"].extend(_attempt_entries(results, now))
        if decision.outcome is Outcome.DEAD_LETTER:
            assert decision.reason is not None
            self._outcomes[Outcome.DEAD_LETTER].inc()
            return [self._dlq(dead_letter(decision.reason, message, delivery=record))]
        retry = self._schedule.next_retry(
            first_attempt_at=first / 1000,
            now=finished,
            tier=record["tier"],
            retry_after=decision.retry_after,
        )
        if retry is None:
            self._outcomes[Outcome.DEAD_LETTER].inc()
            detail = f"retryable failures for {self._schedule.deadline:g} s"
            return [
                self._dlq(
                    dead_letter(
                        DeadLetterReason.DEADLINE_EXCEEDED, message, delivery=record, detail=detail
                    )
                )
            ]
        self._outcomes[Outcome.RETRY].inc()
        record["tier"] = retry.tier
        record["notBefore"] = int(retry.not_before * 1000)
        self._retries[retry.tier].inc()
        return [
            (
                self._topics.retry[retry.tier],
                message.key(),
                self._codec.encode("Delivery", record),
            )
        ]


def _attempt_entries(results: Sequence[UrlResult], started: float) -> list[dict[str, Any]]:
    at = int(started * 1000)
    return [
        {
            "at": at,
            "url": result.url,
            "status": result.status,
            "error": None
            if result.failure is None
            else (f"{result.failure}: {result.detail}" if result.detail else str(result.failure)),
            "durationMs": int(result.duration * 1000),
        }
        for result in results
    ]
