"""What follows a delivery's outcome besides its hand-off: its metrics, the dead-letter record,
and the watch over each destination (operational events, auto-disable).

- ``DestinationMetrics``: one destination's metric series, looked up once (``destination``
  label: its id, or ``other`` past ``PIPELINE_METRICS_MAX_DESTINATIONS``).
- ``DeadLetters``: a dead letter as the record to produce, counted, with an event each time a
  destination's dead letters in this process reach 1, 10, 100, ...
- ``DestinationWatch``: an event when a destination's circuits open or close again; auto-disable
  (``disable_after``): a destination whose every attempt failed for that long is disabled in the
  config, and its pending records are then dead-lettered ``destination_disabled`` (replayable).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from pipeline.core.admission import ParkReason
from pipeline.core.config import ConfigTable, Destination
from pipeline.core.dead_letters import dead_letter
from pipeline.core.durations import format_duration
from pipeline.core.outcomes import Outcome
from pipeline.core.records import DeadLetter, Delivery, dead_letter_to_record
from pipeline.core.secret_rotation import without_ended_secrets
from pipeline.core.topics import Topics
from pipeline.kafka.codec import RecordCodec
from pipeline.kafka.config_store import destination_record
from pipeline.kafka.consumer_loop import ConsumedRecord
from pipeline.kafka.errors import Headed, Outgoing
from pipeline.kafka.events import EventEmitter, EventKind
from pipeline.kafka.producer import Producing
from pipeline.runtime import metrics
from pipeline.runtime.tracing import TraceHeaders

#: How often the deliver role looks for ended rotation windows (seconds).
SECRETS_SWEEP = 30.0

__all__ = ["DestinationMetrics", "DeadLetters", "DestinationWatch", "dead_letter_of"]

log = logging.getLogger("pipeline.deliver")


class DestinationMetrics:
    """One destination's metric series, looked up once."""

    __slots__ = (
        "outcomes",
        "attempt_seconds",
        "retries",
        "parked",
        "suppressed",
        "_circuits",
        "_open",
    )

    def __init__(self, destination: str, tiers: int) -> None:
        label = metrics.destination_label(destination)
        self.outcomes = {o: metrics.DELIVERIES.labels(label, o.value) for o in Outcome}
        self.attempt_seconds = metrics.DELIVERY_ATTEMPT_SECONDS.labels(label)
        self.retries = [metrics.RETRIES.labels(label, str(t)) for t in range(tiers)]
        self.parked = {r: metrics.PARKED.labels(label, r.value) for r in ParkReason}
        self.suppressed = metrics.SUPPRESSED.labels(label)
        self._circuits = metrics.CIRCUITS_OPEN.labels(label)
        self._open = -1

    def circuits(self, open_now: int) -> int:
        """Set the gauge of open circuits; returns the value before (-1: none yet)."""
        before = self._open
        if open_now != before:  # the gauge's lock only on a change
            self._open = open_now
            self._circuits.set(open_now)
        return before


class MetricsByDestination:
    """Each destination's ``DestinationMetrics``, made on first use."""

    def __init__(self, tiers: int) -> None:
        self._tiers = tiers
        self._known: dict[str, DestinationMetrics] = {}

    def __call__(self, destination: str) -> DestinationMetrics:
        found = self._known.get(destination)
        if found is None:
            found = self._known[destination] = DestinationMetrics(destination, self._tiers)
        return found

    def parked(self, destination: str, reason: ParkReason) -> Any:
        """The counter of ``destination``'s records parked for ``reason``."""
        return self(destination).parked[reason]


def dead_letter_of(
    reason: str, consumed: ConsumedRecord, *, delivery: Delivery | None = None, detail: str = ""
) -> DeadLetter:
    """The dead letter of the Kafka record ``consumed``: ``delivery`` when it decoded, else its
    bytes."""
    topic, partition = consumed.key
    return dead_letter(
        reason,
        topic=topic,
        partition=partition,
        offset=consumed.offset,
        raw=consumed.message.value(),
        delivery=delivery,
        detail=detail,
    )


class DeadLetters:
    """Dead letters as the records to produce on the dead-letter topic, counted; ``emit``
    tells of each destination's 1st, 10th, 100th, ... dead letter in this process."""

    def __init__(self, topics: Topics, codec: RecordCodec, events: EventEmitter) -> None:
        self._topic = topics.dlq
        self._codec = codec
        self._events = events
        self._counts: dict[str, int] = {}

    def record(self, letter: DeadLetter, trace: TraceHeaders = ()) -> Outgoing | Headed:
        """The record of ``letter``, with its call's trace context ``trace``."""
        destination = letter.delivery.destination_id if letter.delivery is not None else None
        if destination is None:
            label = metrics.UNKNOWN_DESTINATION
        else:
            label = metrics.destination_label(destination)
            self._counted(destination)
        metrics.DEAD_LETTERS.labels(label, letter.reason).inc()
        value = self._codec.encode("DeadLetter", dead_letter_to_record(letter))
        key = destination.encode() if destination else None
        return (self._topic, key, value, trace) if trace else (self._topic, key, value)

    def _counted(self, destination: str) -> None:
        count = self._counts[destination] = self._counts.get(destination, 0) + 1
        if count == 10 ** (len(str(count)) - 1):
            self._events.emit(
                EventKind.DEAD_LETTERS,
                destination,
                f"{count} dead letter{'s' if count > 1 else ''} since this worker started",
                count=count,
            )


class DestinationWatch:
    """Watches each destination's circuits and failures (see the module's docstring).
    ``spawn``: runs a coroutine in the handler's tasks (the config write of an auto-disable)."""

    def __init__(
        self,
        *,
        role: str,
        topics: Topics,
        codec: RecordCodec,
        producer: Producing,
        events: EventEmitter,
        stop: asyncio.Event,
        spawn: Callable[[Any], None],
    ) -> None:
        self._role = role
        self._config_topic = topics.config
        self._codec = codec
        self._producer = producer
        self._events = events
        self._stop = stop
        self._spawn = spawn
        self._failing_since: dict[str, float] = {}
        #: Destinations this process disabled, as they were then: once the config holds another
        #: version (re-enabled in the console or by apply), their failures count afresh.
        self._disabling: dict[str, Destination] = {}

    def circuits(
        self, destination: Destination, open_now: int, counted: DestinationMetrics
    ) -> None:
        """The gauge of open circuits, and an event when it leaves or returns to zero."""
        before = counted.circuits(open_now)
        if open_now and before <= 0:
            self._events.emit(
                EventKind.CIRCUIT_OPENED,
                destination.id,
                f"{open_now} of {len(destination.webhooks)} webhooks failed repeatedly; "
                "their records are parked until a probe succeeds",
                open=open_now,
                webhooks=len(destination.webhooks),
            )
        elif not open_now and before > 0:
            self._events.emit(
                EventKind.CIRCUIT_CLOSED, destination.id, "every webhook answers again", open=0
            )

    def outcome(self, destination: Destination, outcome: Outcome, at: float) -> None:
        """An attempt's outcome, for ``disable_after`` (when the destination has it)."""
        if destination.disable_after is None:
            return
        if outcome is Outcome.DELIVERED:
            self._failing_since.pop(destination.id, None)
            return
        disabled_from = self._disabling.get(destination.id)
        if disabled_from is not None:
            if destination == disabled_from:
                return  # disabled already; the config does not say so yet
            del self._disabling[destination.id]  # enabled again since: a new run of failures
            self._failing_since[destination.id] = at
        since = self._failing_since.setdefault(destination.id, at)
        if at - since < destination.disable_after:
            return
        self._disabling[destination.id] = destination
        reason = (
            f"every attempt failed for {format_duration(at - since)} "
            f"(disable_after {format_duration(destination.disable_after)})"
        )
        disabled = destination.model_copy(
            update={"enabled": False, "disabled_reason": reason, "disabled_at": int(at * 1000)}
        )
        self._spawn(self._disable(disabled, reason))

    async def sweep_secrets(self, table: Callable[[], ConfigTable]) -> None:
        """Until the worker stops, every ``SECRETS_SWEEP`` seconds: a destination whose rotation
        window ended is written again without the ended secret, so it leaves the config topic
        (compaction then drops the older records). Every deliver role does it; the writes are
        the same."""
        swept: dict[str, Destination] = {}  # by id: the version this process swept last
        while not self._stop.is_set():
            now = time.time()
            for destination in table().destinations.values():
                kept = without_ended_secrets(destination, now)
                if kept is destination or swept.get(destination.id) == destination:
                    continue
                if table().destinations.get(destination.id) != destination:
                    continue  # changed meanwhile (the sends before took a while): next sweep
                swept[destination.id] = destination
                record = destination_record(self._config_topic, self._codec, kept)
                await self._producer.send_all_until_acked([record], self._stop)
                log.info(
                    "%s: destination %s: a rotation window ended; its previous secret is removed",
                    self._role,
                    destination.id,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), SECRETS_SWEEP)

    async def _disable(self, disabled: Destination, reason: str) -> None:
        record = destination_record(self._config_topic, self._codec, disabled)
        await self._producer.send_all_until_acked([record], self._stop)
        log.warning("%s: destination %s disabled: %s", self._role, disabled.id, reason)
        self._events.emit(EventKind.DESTINATION_DISABLED, disabled.id, reason, reason=reason)
