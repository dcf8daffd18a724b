"""``AsyncProducer``'s poll thread outlives a delivery callback that raises: every later
acknowledgement still arrives. A real librdkafka producer, its records timing out unsent (no
broker on the port)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest
from confluent_kafka import KafkaError, Producer

from pipeline.core.settings import Settings
from pipeline.kafka.producer import AsyncProducer, Failed
from pipeline.runtime.net import free_port


def test_a_raising_callback_does_not_stop_the_acknowledgements(
    caplog: pytest.LogCaptureFixture,
) -> None:
    raw = Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{free_port()}",
            "message.timeout.ms": 200,
            "log_level": 0,
        }
    )
    producer = AsyncProducer(Settings(), producer=raw)
    answered = threading.Event()

    def raising(error: KafkaError | None, message: object) -> None:
        raise RuntimeError("a callback's bug")

    def recording(error: KafkaError | None, message: object) -> None:
        answered.set()

    try:
        with caplog.at_level(logging.ERROR, logger="pipeline.kafka"):
            raw.produce("t", b"first", on_delivery=raising)
            deadline = time.monotonic() + 10
            while "a delivery callback failed" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
            assert "a delivery callback failed" in caplog.text
            raw.produce("t", b"second", on_delivery=recording)
            assert answered.wait(10), "the poll thread died with the first callback"
    finally:
        producer.close(timeout=0.1)


def test_a_waiting_send_is_served_by_its_own_event_loop() -> None:
    """While a send waits, the loop polls the producer: with no poll thread left, Kafka's
    answers (here: each record timed out, unsent) still resolve the send."""
    raw = Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{free_port()}",
            "message.timeout.ms": 200,
            "log_level": 0,
        }
    )
    producer = AsyncProducer(Settings(), producer=raw)
    producer._stop.set()  # the idle poll thread ends: only the loop can serve the answers
    producer._thread.join(timeout=5)
    assert not producer._thread.is_alive()

    async def send() -> list[Failed]:
        return await asyncio.wait_for(
            producer.send_all([("t", b"k1", b"v1"), ("t", b"k2", b"v2")]), 10
        )

    try:
        failed = asyncio.run(send())
        assert [failure.record[1] for failure in failed] == [b"k1", b"k2"]
        assert all(failure.refusal.code == KafkaError._MSG_TIMED_OUT for failure in failed)
    finally:
        producer.close(timeout=0.1)
