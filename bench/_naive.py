"""The naive baseline: what a user would write by hand, one message at a time.

    python -m bench._naive URL   (settings from the PIPELINE_* environment)

Poll one call from the ``calls`` topic, render and sign its body (with our own functions, so only
the delivery loop differs), ``requests.post`` it, commit that message synchronously, repeat.
Runs until SIGTERM. Every figure of ``make bench`` has this as its floor.
"""

from __future__ import annotations

import signal
import sys

import requests
from confluent_kafka import Consumer

from pipeline.core.records import call_from_record
from pipeline.core.render import render_body
from pipeline.core.settings import Settings
from pipeline.kafka.clients import consumer_config, topics_for
from pipeline.kafka.codec import Codec

from ._harness import webhook_headers


def main() -> None:
    url = sys.argv[1]
    settings = Settings.from_env()
    consumer = Consumer(consumer_config(settings, f"{settings.topic_prefix}naive"))
    consumer.subscribe([topics_for(settings).calls])
    codec = Codec.default()
    running = True

    def stop(*_: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    try:
        while running:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            body = render_body(call_from_record(codec.decode("Call", message.value())))
            requests.post(url, data=body, headers=webhook_headers(body), timeout=5)
            consumer.commit(message, asynchronous=False)
    finally:
        consumer.close()


if __name__ == "__main__":
    main()
