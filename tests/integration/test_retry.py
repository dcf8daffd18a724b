"""Retry tiers, the deadline, dead letters and replay (seed §4.1, §7), in compressed time.

The ``settings`` fixture sets PIPELINE_RETRY_DELAYS=1s,2s, PIPELINE_RETRY_DEADLINE=8s and
PIPELINE_DELIVERY_TIMEOUT=1s; jitter is ±10 %.
"""

from __future__ import annotations

import orjson

from pipeline.kafka.clients import topics_for
from pipeline.kafka.codec import Codec
from pipeline.kafka.topic_reader import read_topic
from tests.support import (
    apply,
    by_attempt,
    dead_letters,
    run_cli,
    send_calls,
    simple_config,
    stays,
    wait_for,
)

TRACK = {"type": "track", "userId": "u1", "event": "Retried"}


def _times(receiver) -> list[float]:
    return [r.at for r in receiver.requests]


def test_503_503_200_is_delivered_once_after_two_retries(
    settings, receiver_factory, worker_factory
):
    receiver = receiver_factory(200)
    receiver.responses = [503, 503]
    apply(settings, simple_config(receiver.url))
    worker_factory(settings)
    send_calls(settings, [TRACK], "wk")

    wait_for(lambda: receiver.count() == 3)
    assert stays(lambda: receiver.count() == 3, 1.5)
    first, second, third = _times(receiver)
    assert second - first >= 0.9, "tier 0 is 1 s - 10 %"
    assert third - second >= 1.8, "tier 1 is 2 s - 10 %"
    assert len(receiver.delivered()) == 1
    assert len({r.body for r in receiver.requests}) == 1, "every retry sends the same bytes"


def test_retries_are_never_sent_before_their_not_before(settings, receiver_factory, worker_factory):
    """Seed §4.1: a retry waits for its tier. 60 records fail their first attempt together, so the
    retry worker takes them in batches with many due times each (held, then started one by one)."""
    settings = settings.replace(circuit_failures=1000)  # keep the circuit breaker out of it
    receiver = receiver_factory(by_attempt(503, then=200))
    apply(settings, simple_config(receiver.url))
    worker_factory(settings)
    send_calls(settings, [dict(TRACK, messageId=f"early-{n}") for n in range(60)], "wk")

    wait_for(lambda: len(receiver.delivered()) == 60, timeout=30)
    due = {}
    for message in read_topic(settings, topics_for(settings).retry[0], idle_timeout=30):
        record = Codec.default().decode("Delivery", message.value())
        due[record["messageId"]] = record["notBefore"] / 1000
    retried = {r.json["messageId"]: r.at for r in receiver.requests if r.answer == 200}
    assert sorted(due) == sorted(retried)
    late = sorted(retried[m] - due[m] for m in due)
    assert late[0] >= 0, f"a retry was sent {-late[0] * 1000:.1f} ms before its notBefore"
    # Late by milliseconds in `make bench` (section 6); the bound here leaves room for a loaded CI.
    assert late[-1] < 3.0, f"a retry was sent {late[-1]:.2f} s after its notBefore"


def test_always_500_is_dead_lettered_at_the_deadline(settings, receiver_factory, worker_factory):
    receiver = receiver_factory(500)
    apply(settings, simple_config(receiver.url))
    worker_factory(settings)
    send_calls(settings, [TRACK], "wk")

    [letter] = dead_letters(settings, 1, timeout=30)
    assert letter["reason"] == "deadline_exceeded"
    delivery = letter["delivery"]
    attempts = delivery["attempts"]
    assert len(attempts) == receiver.count() >= 4
    assert all(a["status"] == 500 for a in attempts)
    deadline = delivery["firstAttemptAt"] + 8000
    assert delivery["deadline"] == deadline
    assert all(a["at"] <= deadline for a in attempts), "no attempt after the deadline"
    assert _times(receiver)[-1] <= deadline / 1000 + 2.0  # started before it, arrived soon after
    assert stays(lambda: receiver.count() == len(attempts), 1.0)


def test_a_receiver_that_never_answers_in_time_is_retried_then_dead_lettered(
    settings, receiver_factory, worker_factory
):
    receiver = receiver_factory("hang")
    apply(settings, simple_config(receiver.url))
    worker_factory(settings)
    send_calls(settings, [TRACK], "wk")

    [letter] = dead_letters(settings, 1, timeout=40)
    assert letter["reason"] == "deadline_exceeded"
    attempts = letter["delivery"]["attempts"]
    assert len(attempts) >= 3
    assert all(a["error"].startswith("timeout") and a["status"] is None for a in attempts)
    assert all(900 <= a["durationMs"] <= 2500 for a in attempts)


def test_404_and_410_are_dead_lettered_after_one_attempt(
    settings, receiver_factory, worker_factory
):
    receiver = receiver_factory(404)
    receiver.responses = [410]
    apply(settings, simple_config(receiver.url))
    worker_factory(settings)
    send_calls(settings, [TRACK, dict(TRACK, userId="u2")], "wk")

    letters = dead_letters(settings, 2)
    assert [letter["reason"] for letter in letters] == ["client_error", "client_error"]
    assert sorted(letter["delivery"]["attempts"][0]["status"] for letter in letters) == [404, 410]
    assert all(len(letter["delivery"]["attempts"]) == 1 for letter in letters)
    assert stays(lambda: receiver.count() == 2, 2.5)


def test_429_retry_after_is_honoured(settings, receiver_factory, worker_factory):
    receiver = receiver_factory(200)
    receiver.responses = [(429, {"Retry-After": "2"})]
    apply(settings, simple_config(receiver.url))
    worker_factory(settings)
    send_calls(settings, [TRACK], "wk")

    wait_for(lambda: receiver.count() == 2)
    first, second = _times(receiver)
    assert second - first >= 1.95, "Retry-After: 2 beats the 1 s tier"
    assert len(receiver.delivered()) == 1


def test_dlq_list_and_replay_deliver_once_the_receiver_is_fixed(
    settings, receiver_factory, worker_factory
):
    receiver = receiver_factory(404)
    apply(settings, simple_config(receiver.url))
    worker_factory(settings)
    send_calls(settings, [dict(TRACK, messageId="m-replay")], "wk")
    dead_letters(settings, 1)

    listed = run_cli(settings, "dlq", "list")
    assert listed.returncode == 0, listed.stderr
    assert "client_error" in listed.stdout and "m-replay" in listed.stdout
    assert "1 dead letters" in listed.stdout
    as_json = [
        orjson.loads(line)
        for line in run_cli(settings, "dlq", "list", "--json").stdout.splitlines()
    ]
    assert [(e["reason"], e["delivery"]["messageId"]) for e in as_json] == [
        ("client_error", "m-replay")
    ]
    assert (
        run_cli(settings, "dlq", "list", "--reason", "tls_error")
        .stdout.strip()
        .endswith("0 dead letters")
    )
    assert (
        "0 dead letters"
        in run_cli(settings, "dlq", "list", "--since", "1s", "--until", "1s").stdout
    )

    dry = run_cli(settings, "dlq", "replay", "--dry-run")
    assert "would replay 1;" in dry.stdout
    assert stays(lambda: receiver.count() == 1, 0.5)

    receiver.default = 200
    replay = run_cli(settings, "dlq", "replay", "--destination", "hooks")
    assert replay.returncode == 0, replay.stderr
    assert "replayed 1;" in replay.stdout
    wait_for(lambda: len(receiver.delivered()) == 1)
    assert receiver.delivered()[0]["messageId"] == "m-replay"

    again = run_cli(settings, "dlq", "replay")
    assert "replayed 0; skipped 1 already replayed" in again.stdout
    assert stays(lambda: receiver.count() == 2, 1.0)
    assert [
        orjson.loads(line)["replayedAt"] is not None
        for line in run_cli(settings, "dlq", "list", "--json").stdout.splitlines()
    ] == [True]


def test_a_destination_retries_on_its_own_schedule(settings, receiver_factory, worker_factory):
    """A destination's ``retry`` policy replaces the global delays (1 s, 2 s) and deadline (8 s)
    for it alone; its neighbour keeps the global ones."""
    settings = settings.replace(circuit_failures=1000)  # keep the circuit breaker out of it
    own = receiver_factory(by_attempt(503, 503, then=200))
    default = receiver_factory(by_attempt(503, 503, then=200))
    config = simple_config(own.url, retry={"delays": ["3s", "1s"], "deadline": "1m"})
    config["destinations"].append(
        {"id": "plain", "sources": ["web"], "webhooks": [{"url": default.url}]}
    )
    apply(settings, config)
    worker_factory(settings)
    send_calls(settings, [dict(TRACK, messageId="own-1")], "wk")

    wait_for(lambda: own.count() == 3 and default.count() == 3, timeout=30)
    first, second, third = _times(own)
    assert second - first >= 2.7, "its first delay is 3 s - 10 %"
    assert 0.9 <= third - second < 2.5, "its second delay is 1 s"
    first, second, third = _times(default)
    assert 0.9 <= second - first < 2.5 and third - second >= 1.8, "the global 1 s, 2 s"
    tiers: dict[str, list[int]] = {}
    deadlines = {}
    for tier, topic in enumerate(topics_for(settings).retry):
        for message in read_topic(settings, topic, idle_timeout=5):
            record = Codec.default().decode("Delivery", message.value())
            tiers.setdefault(record["destinationId"], []).append(tier)
            deadlines[record["destinationId"]] = record["deadline"] - record["firstAttemptAt"]
    # Its 3 s retry waits in the 2 s tier, its 1 s retry in the 1 s tier.
    assert sorted(tiers["hooks"]) == [0, 1] and sorted(tiers["plain"]) == [0, 1]
    assert deadlines == {"hooks": 60_000, "plain": 8_000}
