"""What becomes of a record after its attempt, where it waits, and each destination's retry
schedule. Pure logic: the clock and the answers are arguments; the handler does the I/O. (What
becomes of a record *before* an attempt is ``pipeline.core.admission``.)

- ``conclude``, from the URLs' results: delivered; the next retry tier with its ``not_before``;
  or dead letter (a permanent failure's reason, or ``deadline_exceeded`` when the deadline leaves
  no room for another try).
- ``park``: the tier and due time of a record that waits while its destination cannot take it.
- ``Schedules``: each destination's retry schedule, its own ``retry`` policy over the global one.

    >>> from pipeline.core.records import Delivery
    >>> from pipeline.core.retry_schedule import RetrySchedule
    >>> d = Delivery("m", "hooks", "web", "track", b"{}", received_at=0)
    >>> s = RetrySchedule(delays=(10.0,), deadline=100.0, jitter=0.0)
    >>> c = conclude(d.stamped(0, 100_000), [UrlResult("u", 503, Failure.SERVER_ERROR)], s, 0.0, 0.5)
    >>> c.outcome, c.delivery.tier, c.delivery.not_before
    (<Outcome.RETRY: 'retry'>, 0, 10500)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from pipeline.core.config import Destination
from pipeline.core.outcomes import DeadLetterReason, Failure, Outcome, UrlResult, decide
from pipeline.core.records import Attempt, Delivery
from pipeline.core.retry_schedule import RetrySchedule

__all__ = [
    "Conclusion",
    "Park",
    "Schedules",
    "conclude",
    "park",
    "attempt_entries",
    "DEADLINE_PASSED",
]

DEADLINE_PASSED = "the deadline passed before this attempt could start"


class Conclusion(NamedTuple):
    """The record's hand-off. ``RETRY``: ``delivery`` goes to retry tier ``delivery.tier``, due at
    ``delivery.not_before``; ``DEAD_LETTER``: to the dead-letter topic for ``reason``;
    ``DELIVERED``: nowhere (a delivered record is not kept)."""

    outcome: Outcome
    delivery: Delivery
    reason: DeadLetterReason | None = None
    detail: str = ""
    requested: bool = False
    """A request was made (its duration is measured); not when decided beforehand."""


class Schedules:
    """The retry schedule of each destination: its own ``retry`` policy over the global
    ``default``, made once per policy.

    >>> Schedules(RetrySchedule())(None).delays
    (10.0, 60.0, 300.0, 1800.0, 3600.0)
    """

    def __init__(self, default: RetrySchedule) -> None:
        self.default = default
        self._known: dict[str, tuple[tuple[object, ...], RetrySchedule]] = {}

    def __call__(self, destination: Destination | None) -> RetrySchedule:
        policy = destination.retry if destination is not None else None
        if policy is None:
            return self.default
        assert destination is not None
        key = (tuple(policy.delays or ()), policy.deadline)
        known = self._known.get(destination.id)
        if known is None or known[0] != key:
            schedule = self.default.for_policy(policy.delays, policy.deadline)
            known = self._known[destination.id] = (key, schedule)
        return known[1]


def conclude(
    delivery: Delivery,
    results: Sequence[UrlResult],
    schedule: RetrySchedule,
    started: float,
    finished: float,
) -> Conclusion:
    """The hand-off after the attempt begun at ``started`` and answered at ``finished`` (epoch
    seconds). Results that are all ``circuit_open`` mean no request was made."""
    requested = not all(result.failure is Failure.CIRCUIT_OPEN for result in results)
    decision = decide(results)
    if decision.outcome is Outcome.DELIVERED:
        return Conclusion(Outcome.DELIVERED, delivery, requested=requested)
    entries = attempt_entries(results, started)
    if decision.outcome is Outcome.DEAD_LETTER:
        assert decision.reason is not None
        return Conclusion(
            Outcome.DEAD_LETTER, delivery.attempted(entries), decision.reason, requested=requested
        )
    first = delivery.first_attempt_at
    retry = schedule.next_retry(
        # Stamped by ``before_attempt``; the attempt's start stands in for a record that was not.
        first_attempt_at=(started * 1000 if first is None else first) / 1000,
        now=finished,
        tier=delivery.tier,
        retry_after=decision.retry_after,
        tried_before=len({attempt.at for attempt in delivery.attempts}),
    )
    if retry is None:
        return Conclusion(
            Outcome.DEAD_LETTER,
            delivery.attempted(entries),
            DeadLetterReason.DEADLINE_EXCEEDED,
            f"retryable failures for {schedule.deadline:g} s",
            requested,
        )
    moved = delivery.attempted(entries, retry.tier, int(retry.not_before * 1000))
    return Conclusion(Outcome.RETRY, moved, requested=requested)


@dataclass(frozen=True, slots=True)
class Park:
    """Where a record waits while its destination cannot take it: in retry tier ``tier`` until
    ``not_before``. ``first_attempt_at`` and ``deadline`` are its deadline's clock, started now
    for a record never attempted (as an attempt refused by an open circuit started it). Epoch ms.
    """

    tier: int
    not_before: int
    first_attempt_at: int
    deadline: int


def park(
    first_attempt_at: int | None,
    deadline: int | None,
    schedule: RetrySchedule,
    now: float,
    wait: float,
) -> Park | None:
    """Park a record for ``wait`` seconds (never past its last slot), in the tier with the
    shortest delay not under ``wait`` (``RetrySchedule.tier_for_wait``); ``None`` when its final
    attempt is due: that one is made."""
    first = first_attempt_at if first_attempt_at is not None else int(now * 1000)
    if deadline is None:
        deadline = int(schedule.deadline_at(first / 1000) * 1000)
    last_slot = schedule.last_slot(first / 1000)
    if now >= last_slot:
        return None
    not_before = int(min(now + wait, last_slot) * 1000)
    return Park(schedule.tier_for_wait(wait), not_before, first, deadline)


def attempt_entries(results: Sequence[UrlResult], started: float) -> tuple[Attempt, ...]:
    """The attempt's entries for the record's history, one per URL."""
    at = int(started * 1000)
    return tuple(
        Attempt(
            at,
            result.url,
            result.status,
            None
            if result.failure is None
            else (f"{result.failure}: {result.detail}" if result.detail else str(result.failure)),
            int(result.duration * 1000),
        )
        for result in results
    )
