"""How the delivery processes of a deployment keep each destination's pace in step: every
``INTERVAL`` each one publishes its ``Report`` per destination to the pace topic, and follows
everyone's (``pipeline.core.pace``: the shares, the pause, the lowered pace).

A pause or a lowered pace is published at once, not at the next interval: the other processes
hold back within the time a record takes through Kafka (their followers fetch with a 100 ms
long poll). This is as close as Kafka-native coordination gets; requests already out in other
processes are not called back, and a process that cannot reach Kafka goes on with what it last
heard (its own pauses still hold). It also sets ``pipeline_destination_pace`` and
``pipeline_destination_paused_seconds``, and emits the operational events of the changes this
process made (``destination_paused``, ``destination_slowed``, ``destination_pace_restored``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Mapping

from confluent_kafka import Message

from pipeline.core.config import Destination
from pipeline.core.endpoint_health import EndpointHealth
from pipeline.core.pace import INTERVAL, PaceChange, Report, report_key
from pipeline.core.settings import Settings
from pipeline.core.topics import Topics
from pipeline.kafka.config_store import ConfigFollower
from pipeline.kafka.events import EventEmitter, EventKind
from pipeline.kafka.producer import AsyncProducer
from pipeline.kafka.topic_reader import TopicFollower
from pipeline.runtime import metrics

__all__ = ["PaceExchange"]

log = logging.getLogger("pipeline.pace")

#: How often the exchange looks for a change to publish at once.
URGENT_CHECK = 0.1
#: How long a stopping process waits for its farewell reports to be acknowledged.
FAREWELL_WAIT = 5.0


class PaceExchange:
    """Publishes ``health.pace``'s reports and feeds it everyone's, from start to ``aclose``."""

    def __init__(
        self,
        settings: Settings,
        topics: Topics,
        health: EndpointHealth,
        producer: AsyncProducer,
        config: ConfigFollower,
        events: EventEmitter,
    ) -> None:
        self._book = health.pace
        self._health = health
        self._producer = producer
        self._config = config
        self._events = events
        self._topic = topics.pace
        self._follower = TopicFollower(settings, topics.pace, self._take, name="pace")
        self._task: asyncio.Task[None] | None = None
        self._shown: set[str] = set()

    def start(self) -> PaceExchange:
        self._follower.start()
        self._task = asyncio.create_task(self._run(), name="pace-exchange")
        return self

    async def aclose(self) -> None:
        """Stop, saying so: a report of no demand for each destination this process asked for
        (``PaceBook.farewell``), so that the others take its share at once."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await asyncio.wait_for(self._send(self._book.farewell()), FAREWELL_WAIT)
        except Exception as exc:  # the others go on without it once its reports age out
            log.warning("pace: the farewell reports were not published: %s", exc or "timed out")
        await asyncio.to_thread(self._follower.stop)

    def _take(self, records: list[Message]) -> None:  # the follower's thread
        for message in records:
            self._book.take(message.key(), message.value())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_tick = loop.time() + INTERVAL
        while True:
            await asyncio.sleep(URGENT_CHECK)
            if loop.time() >= next_tick or self._book.pending():
                next_tick = loop.time() + INTERVAL
                try:
                    await self._publish()
                except Exception:  # pragma: no cover - the pace goes on from what is known
                    log.exception("pace: publishing failed")

    async def _publish(self) -> None:
        destinations = self._config.table.destinations
        limits = {d.id: d.rate_limit for d in destinations.values()}
        reports = self._book.tick(limits)
        for change in self._book.changes():
            self._emit(change)
        self._gauges(destinations)
        await self._send(reports)

    async def _send(self, reports: list[tuple[str, Report]]) -> None:
        if reports:
            failed = await self._producer.send_all(
                [(self._topic, report_key(d, self._book.member), r.encode()) for d, r in reports]
            )
            if failed:
                log.warning("pace: %d reports not published: %s", len(failed), failed[0][1])

    def _gauges(self, destinations: Mapping[str, Destination]) -> None:
        shown = set()
        for destination in destinations.values():
            label = metrics.destination_label(destination.id)
            rate = self._health.group_rate(destination)
            paused = self._book.paused_for(destination.id)
            if rate is not None:
                metrics.DESTINATION_PACE.labels(label).set(rate)
                shown.add(label)
            elif label in self._shown:
                with contextlib.suppress(KeyError):
                    metrics.DESTINATION_PACE.remove(label)
            metrics.DESTINATION_PAUSED.labels(label).set(paused)
        self._shown = shown

    def _emit(self, change: PaceChange) -> None:
        if change.kind == "paused":
            until = datetime.datetime.fromtimestamp(change.until, datetime.UTC)
            self._events.emit(
                EventKind.DESTINATION_PAUSED,
                change.destination,
                f"its receiver answered {change.status} with Retry-After: attempts wait until "
                f"{until:%Y-%m-%d %H:%M:%S} UTC",
                until=int(change.until * 1000),
                status=change.status,
            )
        elif change.kind == "slowed":
            self._events.emit(
                EventKind.DESTINATION_SLOWED,
                change.destination,
                f"its receiver answered 429: pace lowered to {change.pace:.1f}/s",
                pace=change.pace,
            )
        else:
            limit = "its rate_limit" if change.pace is not None else "no limit"
            self._events.emit(
                EventKind.DESTINATION_PACE_RESTORED,
                change.destination,
                f"no 429 for a while: pace back to {limit}",
                pace=change.pace,
            )
