"""Operational events on ``pipeline.events``: what an operator should know, as it happens.

A delivery worker emits, per destination: ``circuit_opened`` (its webhooks' circuits went from
none open to some) and ``circuit_closed`` (back to none), ``destination_disabled`` (auto-disable,
``disable_after``), and ``dead_letters`` each time its dead letters in this process reach 1, 10,
100, ... (a power of ten). Each is one ``OperationalEvent`` record keyed by destination, produced
without waiting: an event that Kafka refuses is logged, never retried in the delivery path.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson
from confluent_kafka import Message

from pipeline.core.exceptions import UndecodableRecord
from pipeline.core.settings import Settings
from pipeline.kafka.clients import topics_for
from pipeline.kafka.codec import RecordCodec
from pipeline.kafka.producer import Producing
from pipeline.kafka.registry_codec import make_codec
from pipeline.kafka.topic_reader import TopicFollower

__all__ = ["EventEmitter", "EventKind", "EventLog", "OperationalEvent"]

log = logging.getLogger("pipeline.events")


class EventKind:
    CIRCUIT_OPENED = "circuit_opened"
    CIRCUIT_CLOSED = "circuit_closed"
    DESTINATION_DISABLED = "destination_disabled"
    DEAD_LETTERS = "dead_letters"
    #: A receiver's Retry-After paused a destination (``data``: ``until`` epoch ms, ``status``).
    DESTINATION_PAUSED = "destination_paused"
    #: A receiver's 429s lowered a destination's pace (``data``: ``pace``, requests/s).
    DESTINATION_SLOWED = "destination_slowed"
    #: A lowered pace is back at the destination's ``rate_limit`` or unlimited.
    DESTINATION_PACE_RESTORED = "destination_pace_restored"
    #: A person changed the config in the console (``data``: the session and the fields).
    CONSOLE_CHANGE = "console_change"


class EventEmitter:
    def __init__(self, producer: Producing, codec: RecordCodec, topic: str) -> None:
        self._producer = producer
        self._codec = codec
        self._topic = topic
        self._process = f"{socket.gethostname()}:{os.getpid()}"
        self._sending: set[asyncio.Task[None]] = set()

    def emit(self, kind: str, destination: str | None, detail: str, **data: Any) -> dict[str, Any]:
        """Produce one event (in the background); returns it as written."""
        event = {
            "id": uuid.uuid4().hex,
            "kind": kind,
            "at": int(time.time() * 1000),
            "destination": destination,
            "detail": detail,
            "data": orjson.dumps(data).decode(),
            "process": self._process,
        }
        log.info("event %s %s: %s", kind, destination or "-", detail)
        value = self._codec.encode("OperationalEvent", event)
        key = destination.encode() if destination else None
        task = asyncio.create_task(self._send(key, value))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)
        return event

    async def _send(self, key: bytes | None, value: bytes) -> None:
        failed = await self._producer.send_all([(self._topic, key, value)])
        if failed:
            log.warning("event not written to %s: %s", self._topic, failed[0])

    async def aclose(self, timeout: float = 5.0) -> None:
        if self._sending:
            await asyncio.wait(self._sending, timeout=timeout)


@dataclass(frozen=True, slots=True)
class OperationalEvent:
    id: str
    kind: str
    at: int
    destination: str | None
    detail: str
    data: dict[str, Any]
    process: str


class EventLog:
    """Follows ``pipeline.events``: the latest events about each destination and source (a
    console change names its entity in ``data``), and whether any process has a destination's
    circuits open now (the console reads it).

    A destination's circuits are open while any process's latest circuit event for it is
    ``circuit_opened``: every delivery worker reports its own circuits.
    """

    def __init__(self, settings: Settings, *, keep: int = 50) -> None:
        self._codec = make_codec(settings)
        self._keep = keep
        self._lock = threading.Lock()
        self._latest: dict[str, deque[OperationalEvent]] = {}
        self._circuits: dict[str, dict[str, bool]] = {}
        self._follower = TopicFollower(
            settings, topics_for(settings).events, self._take, name="events"
        )

    def start(self) -> EventLog:
        self._follower.start()
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        self._follower.wait_ready(timeout)

    def stop(self) -> None:
        self._follower.stop()

    def of(self, entity: str) -> list[OperationalEvent]:
        """The latest events about ``entity`` (``destination:hooks``, ``source:web``), newest
        first."""
        with self._lock:
            return list(reversed(self._latest.get(entity, ())))

    def circuits_open(self, destination: str) -> bool:
        with self._lock:
            return any(self._circuits.get(destination, {}).values())

    def _take(self, records: list[Message]) -> None:
        for message in records:
            value = message.value()
            if value is None:
                continue
            try:
                record = self._codec.decode("OperationalEvent", value)
                data = orjson.loads(record["data"] or "{}")
            except (UndecodableRecord, orjson.JSONDecodeError) as exc:
                log.warning("operational event ignored: %s", exc)
                continue
            event = OperationalEvent(
                record["id"],
                record["kind"],
                record["at"],
                record["destination"],
                record["detail"],
                data if isinstance(data, dict) else {},
                record["process"],
            )
            entity = event.data.get("entity") or (
                f"destination:{event.destination}" if event.destination else None
            )
            if not isinstance(entity, str):
                continue
            with self._lock:
                latest = self._latest.setdefault(entity, deque(maxlen=self._keep))
                latest.append(event)
                if event.destination and event.kind in (
                    EventKind.CIRCUIT_OPENED,
                    EventKind.CIRCUIT_CLOSED,
                ):
                    processes = self._circuits.setdefault(event.destination, {})
                    processes[event.process] = event.kind == EventKind.CIRCUIT_OPENED
