"""The broker stopped (SIGSTOP) for 15 s under a running worker: nothing acknowledged is lost.

Prints calls sent / delivered / duplicated (run with ``-s`` to see them).
"""

from __future__ import annotations

import threading

import pytest

from pipeline.kafka.broker import EmbeddedBroker
from pipeline.kafka.clients import create_topics
from tests.support import apply, delivery_report, fault_calls, send_calls, simple_config, wait_for


@pytest.fixture
def own_broker():
    """A broker of this test alone: pausing the session broker would stall the other tests."""
    with EmbeddedBroker(port=0) as broker:
        yield broker


@pytest.mark.timeout(240)
def test_broker_stopped_for_15_seconds_loses_nothing(
    settings, own_broker, receiver_factory, worker_factory
):
    settings = settings.replace(bootstrap_servers=own_broker.bootstrap_servers)
    create_topics(settings)
    receiver = receiver_factory(200)
    apply(settings, simple_config(receiver.url))
    worker_factory(settings)

    send_calls(settings, fault_calls(100, "before"), "wk")
    wait_for(lambda: len(receiver.delivered()) >= 10)
    own_broker.pause()
    # Calls sent while the broker is stopped are acknowledged once it is back, not before.
    during = threading.Thread(target=send_calls, args=(settings, fault_calls(100, "during"), "wk"))
    during.start()
    try:
        during.join(15)
        assert during.is_alive(), "a send cannot complete while the broker is stopped"
    finally:
        own_broker.resume()
    during.join(60)
    assert not during.is_alive()

    expected = {f"before-{i}" for i in range(100)} | {f"during-{i}" for i in range(100)}
    wait_for(lambda: {b["messageId"] for b in receiver.delivered()} >= expected, timeout=90)
    delivered = delivery_report("broker SIGSTOP 15 s", 200, receiver)
    assert set(delivered) == expected
