"""``TokenBucket``: peeking at the wait, and a new rate that keeps the tokens taken."""

from __future__ import annotations

from pipeline.core.rate_limit import TokenBucket


def test_waiting_peeks_without_taking_a_token() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=2.0, burst=1.0, clock=lambda: now[0])
    assert bucket.waiting() == 0.0
    assert bucket.reserve() == 0.0
    assert bucket.waiting() == 0.5 and bucket.waiting() == 0.5  # asking takes nothing
    now[0] = 0.5
    assert bucket.waiting() == 0.0


def test_a_new_rate_keeps_the_tokens_taken() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=10.0, clock=lambda: now[0])
    for _ in range(10):
        bucket.reserve()  # the burst is spent
    bucket.adjust(5.0)  # a rebalance halved this process's share: no fresh burst
    assert (bucket.rate, bucket.burst) == (5.0, 5.0)
    assert bucket.reserve() == 0.2
