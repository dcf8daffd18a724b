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
import time
import uuid
from typing import Any

import orjson

from pipeline.kafka.codec import RecordCodec
from pipeline.kafka.producer import AsyncProducer

__all__ = ["EventEmitter", "EventKind"]

log = logging.getLogger("pipeline.events")


class EventKind:
    CIRCUIT_OPENED = "circuit_opened"
    CIRCUIT_CLOSED = "circuit_closed"
    DESTINATION_DISABLED = "destination_disabled"
    DEAD_LETTERS = "dead_letters"


class EventEmitter:
    def __init__(self, producer: AsyncProducer, codec: RecordCodec, topic: str) -> None:
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
