"""``pipeline.core.delivery_policy``: the delivery handler's decisions, branch by branch, without
Kafka or HTTP (the clock is an argument, the circuits a function)."""

from __future__ import annotations

import pytest

from pipeline.core.config import Destination
from pipeline.core.delivery_policy import Conclusion, Schedules, attempt_entries, conclude
from pipeline.core.outcomes import DeadLetterReason, Failure, Outcome, UrlResult
from pipeline.core.records import Attempt, Delivery
from pipeline.core.retry_schedule import RetrySchedule

#: Tiers after 10 s, then 60 s; the deadline 1000 s after the first attempt; the last slot at 999 s.
SCHEDULE = RetrySchedule(delays=(10.0, 60.0), deadline=1000.0, jitter=0.0)
T0 = 1_800_000_000.0  # the first attempt, epoch seconds
T0_MS = int(T0 * 1000)
HOOKS = Destination(id="hooks", sources=["web"], webhooks=[{"url": "https://a.example/h"}])  # type: ignore[list-item]
FRESH = Delivery("m1", "hooks", "web", "track", b'{"a":1}', received_at=T0_MS - 500)
STAMPED = FRESH.stamped(T0_MS, T0_MS + 1_000_000)
OK = UrlResult("https://a.example/h", 200, duration=0.012)
E503 = UrlResult("https://a.example/h", 503, Failure.SERVER_ERROR, "503 Service Unavailable", 0.02)
E404 = UrlResult("https://a.example/h", 404, Failure.CLIENT_ERROR, "404 Not Found", 0.01)
OPEN = UrlResult("https://a.example/h", failure=Failure.CIRCUIT_OPEN, detail="circuit open")


# ---- refused by every circuit (with parking off; admission says ``Refused``) -------------------


def test_every_circuit_open_concludes_without_a_request() -> None:
    stamped = FRESH.stamped(T0_MS, T0_MS + 1_000_000)
    decided = conclude(stamped, [OPEN], SCHEDULE, T0, T0)
    assert decided.outcome is Outcome.RETRY and not decided.requested
    retried = decided.delivery
    assert (retried.first_attempt_at, retried.tier, retried.not_before) == (
        T0_MS,
        0,
        T0_MS + 10_000,
    )
    assert retried.attempts == (Attempt(T0_MS, OPEN.url, None, "circuit_open: circuit open", 0),)


def test_a_destinations_own_retry_policy_gives_its_schedule_once_per_policy() -> None:
    schedules = Schedules(SCHEDULE)
    own = Destination.model_validate(
        {**HOOKS.model_dump(), "retry": {"delays": ["45s"], "deadline": "1h"}}
    )
    assert schedules(None) is SCHEDULE and schedules(HOOKS) is SCHEDULE
    first = schedules(own)
    assert first.delays == (45.0,) and first.deadline == 3600.0
    assert schedules(own) is first


# ---- conclude ------------------------------------------------------------------------------------


def test_delivered_keeps_no_history() -> None:
    assert conclude(STAMPED, [OK], SCHEDULE, T0, T0 + 0.1) == Conclusion(
        Outcome.DELIVERED, STAMPED, requested=True
    )


def test_any_2xx_delivers() -> None:
    assert conclude(STAMPED, [E404, OK], SCHEDULE, T0, T0).outcome is Outcome.DELIVERED


def test_permanent_failure_is_dead_lettered_with_its_reason_and_the_attempt() -> None:
    decided = conclude(STAMPED, [E404], SCHEDULE, T0 + 1, T0 + 1.01)
    assert decided.outcome is Outcome.DEAD_LETTER
    assert decided.reason is DeadLetterReason.CLIENT_ERROR and decided.detail == ""
    assert decided.delivery == STAMPED._replace(
        attempts=(Attempt(T0_MS + 1000, E404.url, 404, "client_error: 404 Not Found", 10),)
    )


def test_retryable_failure_goes_to_the_next_tier_with_its_not_before() -> None:
    decided = conclude(STAMPED, [E503], SCHEDULE, T0, T0 + 0.5)
    assert decided.outcome is Outcome.RETRY and decided.requested
    assert decided.delivery == STAMPED._replace(
        tier=0,
        not_before=T0_MS + 10_500,  # 10 s after the failure answered
        attempts=(Attempt(T0_MS, E503.url, 503, "server_error: 503 Service Unavailable", 20),),
    )


def test_later_tiers_use_their_delay_and_the_last_one_repeats() -> None:
    tier0 = STAMPED._replace(tier=0, attempts=(Attempt(T0_MS, "u"),))
    second = conclude(tier0, [E503], SCHEDULE, T0 + 10, T0 + 10)
    assert (second.delivery.tier, second.delivery.not_before) == (1, T0_MS + 70_000)
    assert len(second.delivery.attempts) == 2  # the history grows
    third = conclude(second.delivery, [E503], SCHEDULE, T0 + 70, T0 + 70)
    assert (third.delivery.tier, third.delivery.not_before) == (1, T0_MS + 130_000)


def test_retry_after_lengthens_the_delay() -> None:
    slow = UrlResult("u", 429, Failure.RATE_LIMITED, retry_after=30.0)
    decided = conclude(STAMPED, [slow], SCHEDULE, T0, T0)
    assert decided.delivery.not_before == T0_MS + 30_000


def test_a_retry_past_the_last_slot_is_clamped_to_it() -> None:
    decided = conclude(STAMPED._replace(tier=1), [E503], SCHEDULE, T0 + 950, T0 + 950)
    assert (decided.outcome, decided.delivery.not_before) == (Outcome.RETRY, T0_MS + 999_000)


def test_a_retryable_failure_at_the_last_slot_is_dead_lettered_deadline_exceeded() -> None:
    decided = conclude(STAMPED._replace(tier=1), [E503], SCHEDULE, T0 + 999, T0 + 999.2)
    assert decided.outcome is Outcome.DEAD_LETTER
    assert decided.reason is DeadLetterReason.DEADLINE_EXCEEDED
    assert decided.detail == "retryable failures for 1000 s"
    assert decided.delivery.tier == 1 and len(decided.delivery.attempts) == 1


def test_circuit_open_results_are_not_a_request() -> None:
    assert not conclude(STAMPED, [OPEN], SCHEDULE, T0, T0).requested
    assert conclude(STAMPED, [OPEN, E503], SCHEDULE, T0, T0).requested


@pytest.mark.parametrize(
    ("result", "error"),
    [
        (OK, None),
        (UrlResult("u", None, Failure.TIMEOUT), "timeout"),
        (UrlResult("u", None, Failure.TIMEOUT, "after 5 s"), "timeout: after 5 s"),
    ],
)
def test_attempt_entries(result: UrlResult, error: str | None) -> None:
    [entry] = attempt_entries([result], T0)
    assert entry.error == error and entry.at == T0_MS and entry.status == result.status
