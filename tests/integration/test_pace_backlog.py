"""A long backlog of a destination that waits by choice (``admission.QUEUE_LONG``): its
``rate_limit`` or its ``max_in_flight``. It goes round the retry tier once a minute, not all of it
once or twice a second, and the receiver still gets what the destination allows.

Real broker, real worker processes, a real HTTP receiver on 127.0.0.1.
"""

from __future__ import annotations

import time
from typing import Any

from pipeline.kafka.clients import create_topics
from tests.integration.test_isolation import held
from tests.integration.test_pace import calls, rate_seen, settled, workers
from tests.support import apply, send_calls, simple_config, try_scrape, wait_for

LIMIT = 5.0
BACKLOG = 4000  # 800 s of turns


#: The suite's tiers wait 1 s and 2 s, and its deadline is 8 s (a wait is never past a record's
#: last slot): a long wait needs a tier and a deadline that cover it.
LONG_TIERS = {"PIPELINE_RETRY_DELAYS": "1s,60s", "PIPELINE_RETRY_DEADLINE": "600s"}


def parkings(port: int, reason: str = "rate_limited") -> float:
    samples = try_scrape(port) or {}
    return sum(
        value
        for (name, labels), value in samples.items()
        if name == "pipeline_parked_total" and ("reason", reason) in labels
    )


def parked_and_delivered(port: int, receiver: Any, reason: str) -> tuple[float, float]:
    """Once the backlog was parked once: the records parked again a second, and the calls
    delivered a second, over six seconds."""
    wait_for(lambda: parkings(port, reason) >= BACKLOG * 0.9, timeout=60, interval=0.2)
    time.sleep(3.0)  # the last of the backlog read and parked once
    parked, delivered, started = parkings(port, reason), len(receiver.requests), time.time()
    time.sleep(6.0)
    elapsed = time.time() - started
    parked_rate = (parkings(port, reason) - parked) / elapsed
    delivered_rate = (len(receiver.requests) - delivered) / elapsed
    print(
        f"a backlog of {BACKLOG} ({reason}): {parked_rate:.0f} records parked again a second, "
        f"{delivered_rate:.1f} delivered a second"
    )
    return parked_rate, delivered_rate


def test_a_long_backlog_of_a_limited_destination_is_not_parked_again_and_again(
    settings: Any, receiver_factory: Any, process_factory: Any
) -> None:
    """4,000 calls for a destination limited to 5/s. Parked for their turns half a second at a
    time, all of them came back and were parked again twice a second or more (9,900 parkings a
    second). Now, while 30 s of turns are parked to come back within a second or two, the
    others wait longer, in the tier whose delay covers the wait (here the 60 s one): a few
    seconds in, the worker parks fewer records a second than half the backlog, and the
    receiver gets the limit."""
    receiver = receiver_factory(lambda _body: 200)
    apply(settings, simple_config(receiver.url, rate_limit=LIMIT))
    [port] = workers(process_factory, settings, 1, env=LONG_TIERS)
    wait_for(lambda: held(port).get("deliver", 0.0) == settings.partitions, timeout=60)
    send_calls(settings, calls(BACKLOG), "wk")
    parked_rate, delivered_rate = parked_and_delivered(port, receiver, "rate_limited")
    assert parked_rate < BACKLOG / 2
    assert LIMIT * 0.6 <= delivered_rate <= LIMIT * 1.4


def test_a_long_backlog_at_max_in_flight_is_not_parked_again_every_second(
    settings: Any, receiver_factory: Any, process_factory: Any
) -> None:
    """4,000 calls for a destination with ``max_in_flight: 2`` whose receiver takes 0.2 s a
    request (10/s). Parked for a free slot a second at a time, all of them came back and were
    parked again every second (3,984 a second), and it got 2 a second: two slots' worth of
    each wave. Now a second's worth at its pace waits in memory for a slot, and, once its pace
    is known (its 2xx answers of the last 3 s), the records past 30 s of it wait longer; never
    more than two requests are out."""
    receiver = receiver_factory(200, delay=0.2)
    apply(settings, simple_config(receiver.url, max_in_flight=2))
    [port] = workers(process_factory, settings, 1, env=LONG_TIERS)
    wait_for(lambda: held(port).get("deliver", 0.0) == settings.partitions, timeout=60)
    send_calls(settings, calls(BACKLOG), "wk")
    parked_rate, delivered_rate = parked_and_delivered(port, receiver, "in_flight")
    assert parked_rate < BACKLOG / 2
    assert 6.0 <= delivered_rate <= 10.5  # two at a time, 0.2 s each at least
    with receiver.lock:
        arrivals = sorted(r.at for r in receiver.requests)
    # Each request is answered 0.2 s after it arrived: three within 0.19 s would be three out.
    assert all(later - first >= 0.19 for first, later in zip(arrivals, arrivals[2:], strict=False))


def test_a_rate_limit_holds_across_two_workers_with_tiers_of_a_minute(
    settings: Any, receiver_factory: Any, process_factory: Any
) -> None:
    """The group's limit across two workers, as bench section 14 runs it: tiers long enough
    for the waits of a long queue. A process's own rate swings with its share (to 1 % of the
    limit before the others' reports), and a queue reckoned in it looked minutes long: 300
    calls at 20/s were parked a minute, and the receiver saw 0.12 of the limit. A queue is
    reckoned in the group's pace, so a short backlog only ever waits half a second."""
    limit, count = 20.0, 300
    # The default partitions (6 and 3), as the bench has them: each worker then holds tier
    # partitions that its parked records go to, and counts them in its queue.
    settings = settings.model_copy(
        update={
            "topic_prefix": f"{settings.topic_prefix}b.",
            "partitions": 6,
            "retry_partitions": 3,
        }
    )
    create_topics(settings)
    receiver = receiver_factory(200)
    apply(settings, simple_config(receiver.url, rate_limit=limit))
    ports = workers(process_factory, settings, 2, env=LONG_TIERS)
    wait_for(lambda: settled(settings, ports), timeout=60)
    send_calls(settings, calls(count), "wk")
    wait_for(lambda: len({r.json["messageId"] for r in receiver.requests}) == count, timeout=60)
    observed = rate_seen(receiver, limit, "two workers, tiers of 1 s and 60 s")
    assert limit * 0.9 <= observed <= limit * 1.1
