"""One failing receiver costs its neighbours nothing (issue: per-endpoint isolation).

Real broker, real worker, one real HTTP server on 127.0.0.1 serving two destinations' webhooks on
two paths: the common case of a hosted receiver (one SaaS host, each customer on its own path).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from pipeline.kafka.clients import topics_for
from pipeline.kafka.codec import Codec
from pipeline.kafka.topic_reader import read_topic
from pipeline.roles.parking import PARTS_HEADER, SCHEDULE_HEADER, unpacked
from pipeline.runtime.net import free_port
from tests.support import (
    apply,
    send_calls,
    simple_config,
    stays,
    try_scrape,
    wait_for,
)

CALLS = 200


def answer(body: bytes) -> int:
    """``bad-*`` calls (the failing destination's source) get 500, the rest 200."""
    return 500 if orjson.loads(body)["messageId"].startswith("bad-") else 200


def test_a_failing_endpoint_leaves_its_neighbour_on_the_same_host_alone(
    settings, receiver_factory, worker_factory
):
    settings = settings.replace(
        circuit_failures=5, circuit_cool_down=60.0, retry_delays=(1.0, 600.0)
    )
    receiver = receiver_factory(answer)
    base = receiver.url.rsplit("/", 1)[0]
    config: dict[str, Any] = {
        "sources": [{"id": "a", "write_keys": ["wka"]}, {"id": "b", "write_keys": ["wkb"]}],
        "destinations": [
            {"id": "bad", "sources": ["a"], "webhooks": [{"url": f"{base}/bad"}]},
            {"id": "good", "sources": ["b"], "webhooks": [{"url": f"{base}/good"}]},
        ],
    }
    apply(settings, config)
    worker_factory(settings)
    track = {"type": "track", "userId": "u1", "event": "E"}
    send_calls(settings, [dict(track, messageId=f"bad-{n}") for n in range(CALLS)], "wka")
    send_calls(settings, [dict(track, messageId=f"good-{n}") for n in range(CALLS)], "wkb")

    def on(path: str) -> list[Any]:
        with receiver.lock:
            return [r for r in receiver.requests if r.path == path]

    wait_for(lambda: len(on("/good")) == CALLS, timeout=60)
    # The healthy destination got every call once, at its first attempt: none was refused by
    # its neighbour's open circuit and retried later.
    good = on("/good")
    assert sorted(r.json["messageId"] for r in good) == sorted(f"good-{n}" for n in range(CALLS))
    assert all(r.answer == 200 for r in good)
    # The failing one's own circuit opened: the rest of its calls were not sent (they wait,
    # parked, for the circuit to half-open in a minute). What went out before the first answers
    # came back is bounded by the host's connection limit (100), not by the breaker.
    bad = len(on("/bad"))
    assert 5 <= bad < CALLS
    assert stays(lambda: len(on("/bad")) == bad, 2.0)  # the tier-0 retries (1 s) are parked too
    print(f"shared host: good {len(good)}/{CALLS} at the first attempt; bad {bad} requests")


def held(port: int) -> dict[str, float]:
    """``pipeline_partitions_held`` by role, from the ``/metrics`` of the process on ``port``
    (nothing while it is not serving yet)."""
    samples = try_scrape(port) or {}
    return {
        dict(labels)["role"]: value
        for (name, labels), value in samples.items()
        if name == "pipeline_partitions_held"
    }


def backlog_rate(times: list[float]) -> float:
    """Requests per second while a backlog waits: past the first second (each process starts
    with a burst of its share) and up to the last tenth of the calls (as the backlog runs out,
    the last ones wait at the pace of the process that holds them)."""
    end = times[int(len(times) * 0.9)]
    steady = [t for t in times if times[0] + 1.0 <= t <= end]
    return (len(steady) - 1) / (steady[-1] - steady[0])


def test_a_rate_limit_holds_for_the_group_across_two_workers(
    settings, receiver_factory, process_factory
):
    """``rate_limit`` is the whole group's: two worker processes each send their partitions'
    share, and the receiver sees the limit, within 10 %."""
    limit, calls = 40.0, 480
    receiver = receiver_factory(200)
    apply(settings, simple_config(receiver.url, rate_limit=limit))
    ports = [free_port(), free_port()]
    for port in ports:  # whichever holds which partitions, the total is the limit
        process_factory(settings, "worker", "--no-log-store", "--metrics-port", str(port))

    def split() -> bool:
        """Both workers hold deliver partitions, and the group assigned all of them."""
        shares = [held(port).get("deliver", 0.0) for port in ports]
        return min(shares) >= 1 and sum(shares) == settings.partitions

    # The group has settled before the calls go: a rebalance moving shares while the calls are
    # sent would measure the join (and session timeouts on a slow machine), not the limit.
    wait_for(split, timeout=60)
    track = {"type": "track", "event": "E"}
    send_calls(
        settings, [dict(track, userId=f"u{n}", messageId=f"r{n}") for n in range(calls)], "wk"
    )

    wait_for(lambda: len({r.json["messageId"] for r in receiver.requests}) == calls, timeout=90)
    times = sorted(r.at for r in receiver.requests)
    observed = backlog_rate(times)
    print(f"rate limit {limit:g}/s for the group, two workers: {observed:.1f}/s")
    # Within 10 % either way: the processes split the limit by what each has waiting
    # (pipeline.core.pace), so an uneven split of the partitions loses no rate.
    assert limit * 0.9 <= observed <= limit * 1.1


def test_operational_events_say_when_a_circuit_opens_and_dead_letters_begin(
    settings, receiver_factory, worker_factory
):
    settings = settings.replace(circuit_failures=2, circuit_cool_down=60.0)
    failing = receiver_factory(500)
    gone = receiver_factory(404)
    config = simple_config(failing.url)
    config["destinations"].append(
        {"id": "gone", "sources": ["web"], "webhooks": [{"url": gone.url}]}
    )
    apply(settings, config)
    worker_factory(settings)
    track = {"type": "track", "userId": "u1", "event": "E"}
    send_calls(settings, [dict(track, messageId=f"e{n}") for n in range(4)], "wk")

    def seen() -> set[tuple[str, str]]:
        found = set()
        for message in read_topic(settings, topics_for(settings).events, idle_timeout=2):
            event = Codec.default().decode("OperationalEvent", message.value())
            assert message.key() == event["destination"].encode()
            found.add((event["kind"], event["destination"]))
        return found

    wanted = {("circuit_opened", "hooks"), ("dead_letters", "gone")}
    wait_for(lambda: wanted <= seen(), timeout=30)


def records(settings: Any, topic: str) -> list[tuple[str, str, bool]]:
    """(message id, destination, parked: a schedule header and no attempt) of the delivery
    records in ``topic``, those of parked batches included."""
    found = []
    for message in read_topic(settings, topic, idle_timeout=2):
        headers = dict(message.headers() or [])
        carried = (  # a parked batch: the records parked together, in one
            [part.value() for part in unpacked(message.value(), message.headers() or [])]
            if PARTS_HEADER in headers
            else [message.value()]
        )
        for value in carried:
            record = Codec.default().decode("Delivery", value)
            parked = SCHEDULE_HEADER in headers and not record["attempts"]
            found.append((record["messageId"], record["destinationId"], parked))
    return found


def test_a_destination_whose_circuit_is_open_is_parked_at_routing(
    settings, receiver_factory, worker_factory
):
    """With the router and the deliver role in one process, a call's record for a destination
    whose endpoint's circuit is open goes straight to a retry tier with its park header: it
    never passes through ``deliveries`` (a produce, a consume and a decode fewer a call)."""
    settings = settings.replace(
        circuit_failures=3, circuit_cool_down=60.0, retry_delays=(1.0, 600.0)
    )
    good, bad = receiver_factory(200), receiver_factory(500)
    config = simple_config(good.url)
    config["destinations"].append({"id": "bad", "sources": ["web"], "webhooks": [{"url": bad.url}]})
    apply(settings, config)
    worker_factory(settings)
    track = {"type": "track", "userId": "u1", "event": "E"}
    send_calls(settings, [dict(track, messageId=f"before-{n}") for n in range(5)], "wk")
    topics = topics_for(settings)

    def opened() -> bool:
        for message in read_topic(settings, topics.events, idle_timeout=2):
            event = Codec.default().decode("OperationalEvent", message.value())
            if (event["kind"], event["destination"]) == ("circuit_opened", "bad"):
                return True
        return False

    wait_for(opened, timeout=30)
    after = [f"after-{n}" for n in range(40)]
    send_calls(settings, [dict(track, messageId=m) for m in after], "wk")
    wait_for(lambda: len(good.requests) == 45, timeout=30)

    main = [(m, d) for m, d, _ in records(settings, topics.deliveries) if m.startswith("after-")]
    assert sorted(main) == sorted((m, "hooks") for m in after)  # only the healthy one's
    # parked until the circuit half-opens (60 s): in the tier whose delay is not under that
    wait_for(
        lambda: (
            {m for m, d, p in records(settings, topics.retry[1]) if d == "bad" and p} >= set(after)
        )
    )
    assert len(bad.requests) < 10  # before the circuit opened, and no more


def test_a_new_endpoint_that_never_answers_takes_no_more_records_than_its_hosts_connections(
    settings, receiver_factory, process_factory
):
    """A destination whose first requests have gone unanswered for a moment takes no more of a
    worker's in-flight records than its host has connections: the rest are parked at once
    (``unanswered``). They used to wait behind its first requests, and its healthy neighbour's
    records waited with them. Its second webhook refuses connections, so it is never silent
    (silence needs every webhook silent): only this rule parks its records."""
    settings = settings.replace(
        max_connections_per_host=3,
        delivery_timeout=5.0,
        circuit_failures=1000,
        circuit_cool_down=60.0,
        retry_delays=(1.0, 600.0),
        retry_deadline=3600.0,
    )
    good, mute = receiver_factory(200), receiver_factory("hang")
    refused = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    config = simple_config(good.url)
    config["destinations"].append(
        {"id": "mute", "sources": ["web"], "webhooks": [{"url": mute.url}, {"url": refused}]}
    )
    apply(settings, config)
    port = free_port()
    process_factory(settings, "worker", "--metrics-port", str(port))
    wait_for(lambda: try_scrape(port), timeout=30)
    track = {"type": "track", "userId": "u1", "event": "E"}
    send_calls(settings, [dict(track, messageId=f"a{n}") for n in range(20)], "wk")
    wait_for(lambda: mute.count() == 3, timeout=30)  # its host's connections, all hanging
    time.sleep(0.1)  # past UNPROVEN_AFTER (50 ms): the worker's clock, not the test's
    send_calls(settings, [dict(track, messageId=f"b{n}") for n in range(20)], "wk")
    wait_for(lambda: good.count() == 40, timeout=30)

    def parked(reason: str) -> float:
        samples = try_scrape(port) or {}
        return samples.get(("pipeline_parked_total", (("reason", reason),)), 0.0)

    # The second wave came while the endpoint was unproven, with three of its records out.
    wait_for(lambda: parked("unanswered") >= 20, timeout=10)
    assert mute.count() == 3
    # The router parked them itself, as the deliver role in its process would have: they went
    # straight to the first tier, and never through ``deliveries``.
    topics = topics_for(settings)
    second = {f"b{n}" for n in range(20)}
    routed = [(m, d) for m, d, _ in records(settings, topics.deliveries) if m in second]
    assert sorted(routed) == sorted((m, "hooks") for m in second)  # the healthy one's only
    assert {m for m, d, p in records(settings, topics.retry[0]) if d == "mute" and p} >= second
