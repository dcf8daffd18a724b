"""Delivery: several webhooks (seed §4.1 rule 2), TLS verification (rule 4), undecodable records."""

from __future__ import annotations

import ssl

import trustme
from confluent_kafka import Producer

from pipeline.kafka.clients import topics_for
from tests.support import apply, dead_letters, send_calls, simple_config, stays, wait_for


def test_one_success_among_three_webhooks_is_processed_and_not_retried(
    settings, receiver_factory, worker_factory
):
    ok, failing_a, failing_b = receiver_factory(200), receiver_factory(500), receiver_factory(500)
    apply(settings, simple_config(failing_a.url, ok.url, failing_b.url))
    worker_factory(settings)
    send_calls(settings, [{"type": "track", "userId": "u1", "event": "Signed Up"}], "wk")

    wait_for(lambda: ok.count() == 1 and failing_a.count() == 1 and failing_b.count() == 1)
    # The first retry tier is 1 s (±10 %): nothing may come after it.
    assert stays(lambda: (ok.count(), failing_a.count(), failing_b.count()) == (1, 1, 1), 2.5)
    assert ok.requests[0].body == failing_a.requests[0].body == failing_b.requests[0].body


def test_self_signed_https_receiver_gets_no_request(settings, receiver_factory, worker_factory):
    authority = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(context)
    receiver = receiver_factory(ssl_context=context)
    assert receiver.url.startswith("https://127.0.0.1:")
    apply(settings, simple_config(receiver.url))
    worker_factory(settings)
    send_calls(settings, [{"type": "identify", "userId": "u1", "traits": {"a": 1}}], "wk")

    [letter] = dead_letters(settings, 1)
    assert letter["reason"] == "tls_error"
    [attempt] = letter["delivery"]["attempts"]
    assert attempt["url"] == receiver.url
    assert attempt["status"] is None
    assert "certificate" in attempt["error"].lower()
    assert receiver.count() == 0


def test_undecodable_records_are_dead_lettered_and_the_worker_goes_on(
    settings, receiver_factory, worker_factory
):
    receiver = receiver_factory()
    apply(settings, simple_config(receiver.url))
    topics = topics_for(settings)
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    producer.produce(topics.calls, b"not avro at all", b"u1")
    producer.produce(topics.deliveries, b"\xc3\x01" + b"\x00" * 8 + b"junk", b"k")
    producer.flush(10)
    worker_factory(settings)
    send_calls(settings, [{"type": "track", "userId": "u1", "event": "After Garbage"}], "wk")

    wait_for(lambda: receiver.count() == 1)
    letters = dead_letters(settings, 2)
    assert sorted(letter["reason"] for letter in letters) == ["undecodable", "undecodable"]
    assert sorted(letter["sourceTopic"] for letter in letters) == sorted(
        [topics.calls, topics.deliveries]
    )
    assert {letter["raw"] for letter in letters} == {
        b"not avro at all",
        b"\xc3\x01" + b"\x00" * 8 + b"junk",
    }
