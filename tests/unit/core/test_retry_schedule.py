"""Unit tests for pipeline.core.retry_schedule: tiers, jitter, Retry-After and the 4-hour deadline."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.retry_schedule import Retry, RetrySchedule

T0 = 1_795_273_470.0  # an arbitrary first attempt, epoch seconds
DEFAULT_DELAYS = (10.0, 60.0, 300.0, 1800.0, 3600.0)
HOURS_4 = 4 * 3600.0


def no_jitter(low: float, high: float) -> float:
    return 0.0


def lowest(low: float, high: float) -> float:
    return low


def highest(low: float, high: float) -> float:
    return high


def test_defaults_follow_design() -> None:
    schedule = RetrySchedule()
    assert schedule.delays == DEFAULT_DELAYS
    assert schedule.deadline == HOURS_4
    assert schedule.jitter == pytest.approx(0.1)
    assert schedule.margin == 1.0
    assert schedule.deadline_at(T0) == T0 + HOURS_4


@pytest.mark.parametrize(
    ("tier", "next_tier", "delay"),
    [
        (-1, 0, 10.0),  # first failure on the main topic
        (0, 1, 60.0),
        (1, 2, 300.0),
        (2, 3, 1800.0),
        (3, 4, 3600.0),
        (4, 4, 3600.0),  # the last delay repeats
        (5, 4, 3600.0),
        (40, 4, 3600.0),
    ],
)
def test_every_tier_without_jitter(tier: int, next_tier: int, delay: float) -> None:
    schedule = RetrySchedule(jitter=0.0)
    now = T0 + 5.0
    assert schedule.next_retry(first_attempt_at=T0, now=now, tier=tier) == Retry(
        next_tier, now + delay
    )
    # the injected uniform function gives the same answer
    assert schedule.next_retry(first_attempt_at=T0, now=now, tier=tier, uniform=no_jitter) == Retry(
        next_tier, now + delay
    )


def test_a_whole_life_of_failures_without_jitter() -> None:
    schedule = RetrySchedule(jitter=0.0)
    now, tier = T0, -1
    attempts = [now]
    while (retry := schedule.next_retry(first_attempt_at=T0, now=now, tier=tier)) is not None:
        assert retry.not_before > now
        now, tier = retry.not_before, retry.tier
        attempts.append(now)
        assert schedule.may_attempt(first_attempt_at=T0, now=now)
    offsets = [a - T0 for a in attempts]
    assert offsets == [0, 10, 70, 370, 2170, 5770, 9370, 12970, HOURS_4 - 1]
    assert attempts[-1] < schedule.deadline_at(T0)


@pytest.mark.parametrize(("uniform", "factor"), [(lowest, 0.9), (highest, 1.1)])
@pytest.mark.parametrize(("tier", "base"), [(-1, 10.0), (0, 60.0), (2, 1800.0), (9, 3600.0)])
def test_jitter_extremes_are_plus_minus_ten_percent(
    uniform: object, factor: float, tier: int, base: float
) -> None:
    schedule = RetrySchedule()
    retry = schedule.next_retry(first_attempt_at=T0, now=T0, tier=tier, uniform=uniform)  # type: ignore[arg-type]
    assert retry is not None
    assert retry.not_before - T0 == pytest.approx(base * factor)


def test_uniform_is_asked_for_plus_minus_jitter() -> None:
    calls: list[tuple[float, float]] = []

    def spy(low: float, high: float) -> float:
        calls.append((low, high))
        return 0.05

    retry = RetrySchedule(jitter=0.25).next_retry(first_attempt_at=T0, now=T0, tier=0, uniform=spy)
    assert calls == [(-0.25, 0.25)]
    assert retry == Retry(1, pytest.approx(T0 + 63.0))  # type: ignore[arg-type]


@given(st.floats(min_value=-0.1, max_value=0.1), st.integers(min_value=-1, max_value=10))
def test_jitter_stays_within_bounds(fraction: float, tier: int) -> None:
    schedule = RetrySchedule()
    retry = schedule.next_retry(
        first_attempt_at=T0, now=T0, tier=tier, uniform=lambda low, high: fraction
    )
    assert retry is not None
    base = DEFAULT_DELAYS[min(tier + 1, 4)]
    assert base * 0.9 - 1e-6 <= retry.not_before - T0 <= base * 1.1 + 1e-6


def test_real_randomness_stays_within_bounds() -> None:
    schedule = RetrySchedule()
    for _ in range(200):
        retry = schedule.next_retry(first_attempt_at=T0, now=T0, tier=-1)
        assert retry is not None
        assert 9.0 <= retry.not_before - T0 <= 11.0


# ---- the deadline ----------------------------------------------------------------------------------


def test_clamped_to_the_last_slot() -> None:
    schedule = RetrySchedule(jitter=0.0)
    last_slot = T0 + HOURS_4 - 1.0
    now = T0 + HOURS_4 - 600.0  # ten minutes left; the tier asks for an hour
    assert schedule.next_retry(first_attempt_at=T0, now=now, tier=4) == Retry(4, last_slot)
    # even with positive jitter
    assert schedule.next_retry(first_attempt_at=T0, now=now, tier=4, uniform=highest) == Retry(
        4, last_slot
    )
    # a delay that ends exactly on the last slot is not changed
    now = last_slot - 3600.0
    assert schedule.next_retry(first_attempt_at=T0, now=now, tier=4) == Retry(4, last_slot)


@pytest.mark.parametrize("after_last_slot", [0.0, 0.001, 0.5, 1.0, 60.0, 86400.0])
def test_none_at_or_after_the_last_slot(after_last_slot: float) -> None:
    schedule = RetrySchedule()
    now = T0 + HOURS_4 - 1.0 + after_last_slot
    assert schedule.next_retry(first_attempt_at=T0, now=now, tier=4) is None
    assert schedule.next_retry(first_attempt_at=T0, now=now, tier=-1) is None


def test_just_before_the_last_slot_retries_at_the_last_slot() -> None:
    schedule = RetrySchedule(jitter=0.0)
    now = T0 + HOURS_4 - 1.5
    assert schedule.next_retry(first_attempt_at=T0, now=now, tier=0) == Retry(1, T0 + HOURS_4 - 1.0)


def test_short_deadline_margin_is_a_tenth() -> None:
    schedule = RetrySchedule(delays=(1.0, 2.0), deadline=8.0, jitter=0.0)
    assert schedule.margin == pytest.approx(0.8)
    assert schedule.next_retry(first_attempt_at=0.0, now=0.0, tier=-1) == Retry(0, 1.0)
    assert schedule.next_retry(first_attempt_at=0.0, now=1.0, tier=0) == Retry(1, 3.0)
    assert schedule.next_retry(first_attempt_at=0.0, now=3.0, tier=1) == Retry(1, 5.0)
    assert schedule.next_retry(first_attempt_at=0.0, now=6.5, tier=1) == Retry(1, 7.2)
    assert schedule.next_retry(first_attempt_at=0.0, now=7.2, tier=1) is None


def test_may_attempt_never_after_the_deadline() -> None:
    schedule = RetrySchedule()
    assert schedule.may_attempt(first_attempt_at=None, now=T0 + 10 * HOURS_4)  # never attempted
    assert schedule.may_attempt(first_attempt_at=T0, now=T0)
    assert schedule.may_attempt(first_attempt_at=T0, now=T0 + HOURS_4 - 1.0)
    assert schedule.may_attempt(first_attempt_at=T0, now=T0 + HOURS_4)
    assert not schedule.may_attempt(first_attempt_at=T0, now=T0 + HOURS_4 + 0.001)
    assert not schedule.may_attempt(first_attempt_at=T0, now=T0 + 2 * HOURS_4)


# ---- Retry-After -----------------------------------------------------------------------------------


def test_retry_after_longer_than_the_delay_is_honoured() -> None:
    schedule = RetrySchedule(jitter=0.0)
    assert schedule.next_retry(first_attempt_at=T0, now=T0, tier=-1, retry_after=120.0) == Retry(
        0, T0 + 120.0
    )


def test_retry_after_shorter_than_the_delay_is_ignored() -> None:
    schedule = RetrySchedule(jitter=0.0)
    assert schedule.next_retry(first_attempt_at=T0, now=T0, tier=1, retry_after=5.0) == Retry(
        2, T0 + 300.0
    )
    assert schedule.next_retry(first_attempt_at=T0, now=T0, tier=1, retry_after=0.0) == Retry(
        2, T0 + 300.0
    )


def test_retry_after_compares_with_the_jittered_delay() -> None:
    schedule = RetrySchedule()
    # 10 s with -10 % jitter is 9 s: a Retry-After of 9.5 s is longer and wins
    retry = schedule.next_retry(
        first_attempt_at=T0, now=T0, tier=-1, retry_after=9.5, uniform=lowest
    )
    assert retry == Retry(0, T0 + 9.5)
    # 10 s with +10 % is 11 s: 9.5 s is shorter and is ignored
    retry = schedule.next_retry(
        first_attempt_at=T0, now=T0, tier=-1, retry_after=9.5, uniform=highest
    )
    assert retry is not None and retry.not_before == pytest.approx(T0 + 11.0)


def test_retry_after_past_the_deadline_is_ignored() -> None:
    schedule = RetrySchedule(jitter=0.0)
    # a whole day: outside the 4-hour window, so the tier's own delay is used
    assert schedule.next_retry(first_attempt_at=T0, now=T0, tier=-1, retry_after=86400.0) == Retry(
        0, T0 + 10.0
    )
    # landing exactly on the last slot is still inside
    assert schedule.next_retry(
        first_attempt_at=T0, now=T0, tier=-1, retry_after=HOURS_4 - 1.0
    ) == Retry(0, T0 + HOURS_4 - 1.0)
    # one past the last slot is not; near the end the tier's delay is then clamped
    now = T0 + HOURS_4 - 100.0
    assert schedule.next_retry(first_attempt_at=T0, now=now, tier=-1, retry_after=100.0) == Retry(
        0, now + 10.0
    )
    assert schedule.next_retry(first_attempt_at=T0, now=now, tier=3, retry_after=100.0) == Retry(
        4, T0 + HOURS_4 - 1.0
    )


@given(
    now_offset=st.floats(min_value=0.0, max_value=HOURS_4 + 10.0),
    tier=st.integers(min_value=-1, max_value=8),
    fraction=st.floats(min_value=-0.1, max_value=0.1),
    retry_after=st.none() | st.floats(min_value=0.0, max_value=2 * HOURS_4),
)
def test_any_retry_is_in_the_future_and_before_the_deadline(
    now_offset: float, tier: int, fraction: float, retry_after: float | None
) -> None:
    schedule = RetrySchedule()
    now = T0 + now_offset
    retry = schedule.next_retry(
        first_attempt_at=T0,
        now=now,
        tier=tier,
        retry_after=retry_after,
        uniform=lambda low, high: fraction,
    )
    last_slot = T0 + HOURS_4 - 1.0
    if now >= last_slot:
        assert retry is None
        return
    assert retry is not None
    assert now < retry.not_before <= last_slot
    assert retry.tier == min(tier + 1, len(DEFAULT_DELAYS) - 1)
    assert schedule.may_attempt(first_attempt_at=T0, now=retry.not_before)


# ---- a destination's own policy ----------------------------------------------------------------

GLOBAL = RetrySchedule(delays=(10.0, 60.0, 300.0, 1800.0, 3600.0), deadline=HOURS_4, jitter=0.0)


def test_no_policy_is_the_global_schedule() -> None:
    assert GLOBAL.for_policy(None, None) is GLOBAL


def test_a_policy_deadline_alone_keeps_the_global_delays_and_tiers() -> None:
    own = GLOBAL.for_policy(None, 600.0)
    assert (own.delays, own.deadline, own.tier_delays) == (GLOBAL.delays, 600.0, None)


@pytest.mark.parametrize(
    ("tried_before", "expected"),
    [
        (0, Retry(0, T0 + 45.0)),  # 45 s: in the 10 s tier (the longest not over 45 s)
        (1, Retry(2, T0 + 300.0)),  # 300 s: the 300 s tier
        (2, Retry(4, T0 + 7200.0)),  # 2 h: the 1 h tier
        (9, Retry(4, T0 + 7200.0)),  # the last delay repeats
    ],
)
def test_own_delays_go_to_the_tier_with_the_longest_delay_not_over_them(
    tried_before: int, expected: Retry
) -> None:
    own = GLOBAL.for_policy([45.0, 300.0, 7200.0], None)
    assert own.tier_delays == GLOBAL.delays
    retry = own.next_retry(first_attempt_at=T0, now=T0, tier=3, tried_before=tried_before)
    assert retry == expected


def test_an_own_delay_shorter_than_every_tier_goes_to_the_first() -> None:
    own = GLOBAL.for_policy([2.0], None)
    assert own.next_retry(first_attempt_at=T0, now=T0, tier=-1) == Retry(0, T0 + 2.0)


def test_an_own_deadline_bounds_own_retries() -> None:
    own = GLOBAL.for_policy([45.0], 100.0)
    assert own.next_retry(first_attempt_at=T0, now=T0 + 60.0, tier=0, tried_before=1) == Retry(
        0, T0 + 99.0
    )
    assert own.next_retry(first_attempt_at=T0, now=T0 + 99.0, tier=0, tried_before=2) is None
