"""``AsyncProducer``'s poll thread outlives a delivery callback that raises: every later
acknowledgement still arrives. A real librdkafka producer, its records timing out unsent (no
broker on the port)."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from confluent_kafka import KafkaError, Producer

from pipeline.core.settings import Settings
from pipeline.kafka.producer import AsyncProducer
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
