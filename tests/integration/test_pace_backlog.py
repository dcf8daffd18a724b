"""A long backlog of a rate-limited destination (``admission.RATE_QUEUE_LONG``): it goes round the
retry tier once, not twice a second all of it, and the receiver still sees the limit.

Real broker, a real worker process, a real HTTP receiver on 127.0.0.1.
"""

from __future__ import annotations

import time
from typing import Any

from tests.integration.test_isolation import held
from tests.integration.test_pace import calls, workers
from tests.support import apply, send_calls, simple_config, try_scrape, wait_for

LIMIT = 5.0
BACKLOG = 4000  # 800 s of turns


def rate_limited_parkings(port: int) -> float:
    samples = try_scrape(port) or {}
    return sum(
        value
        for (name, labels), value in samples.items()
        if name == "pipeline_parked_total" and ("reason", "rate_limited") in labels
    )


def test_a_long_backlog_of_a_limited_destination_is_not_parked_again_and_again(
    settings: Any, receiver_factory: Any, process_factory: Any
) -> None:
    """4,000 calls for a destination limited to 5/s. Parked for their turns half a second at a
    time, all of them came back and were parked again twice a second or more (8,000+ parkings a
    second). Now the records behind 30 s of turns wait behind them, in the tier whose delay
    covers the wait (here the 60 s one): a few seconds in, the worker parks fewer records a
    second than the backlog holds, and the receiver gets the limit."""
    receiver = receiver_factory(lambda _body: 200)
    apply(settings, simple_config(receiver.url, rate_limit=LIMIT))
    # The suite's tiers wait 1 s and 2 s, and its deadline is 8 s (a wait is never past a
    # record's last slot): a long wait needs a tier and a deadline that cover it.
    env = {"PIPELINE_RETRY_DELAYS": "1s,60s", "PIPELINE_RETRY_DEADLINE": "600s"}
    [port] = workers(process_factory, settings, 1, env=env)
    wait_for(lambda: held(port).get("deliver", 0.0) == settings.partitions, timeout=60)
    send_calls(settings, calls(BACKLOG), "wk")
    wait_for(lambda: rate_limited_parkings(port) >= BACKLOG * 0.9, timeout=60, interval=0.2)
    time.sleep(3.0)  # the last of the backlog read and parked once
    parked, delivered, started = rate_limited_parkings(port), len(receiver.requests), time.time()
    time.sleep(6.0)
    elapsed = time.time() - started
    parked_rate = (rate_limited_parkings(port) - parked) / elapsed
    delivered_rate = (len(receiver.requests) - delivered) / elapsed
    print(
        f"a backlog of {BACKLOG} at {LIMIT:g}/s: {parked_rate:.0f} records parked again a "
        f"second, {delivered_rate:.1f} delivered a second"
    )
    assert parked_rate < BACKLOG / 2
    assert LIMIT * 0.6 <= delivered_rate <= LIMIT * 1.4
