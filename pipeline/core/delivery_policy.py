"""What the delivery handler decides for a record, as pure functions. Pure logic: the clock, the
live destination and the circuits' answer are arguments; the handler does the I/O around them.

``before_attempt`` (steps 1 and 2 of ``pipeline.roles.deliver``), for a due record:

- the destination deleted or disabled → dead letter (``destination_deleted`` / ``_disabled``);
- its deadline passed → dead letter (``deadline_exceeded``) without an attempt;
- else ``Go``: the request is to be made; a first attempt stamps ``first_attempt_at`` and the
  ``deadline``; the last slot before the deadline is the ``final`` attempt, made even through open
  circuits;
- unless every webhook's circuit is open (and it is not the final attempt): concluded from the
  circuits' refusals without a request.

``conclude`` (steps 3 and 4), from the URLs' results: delivered; the next retry tier with its
``not_before``; or dead letter (a permanent failure's reason, or ``deadline_exceeded`` when the
deadline leaves no room for another try).

    >>> from pipeline.core.records import Delivery
    >>> from pipeline.core.retry_schedule import RetrySchedule
    >>> d = Delivery("m", "hooks", "web", "track", b"{}", received_at=0)
    >>> s = RetrySchedule(delays=(10.0,), deadline=100.0, jitter=0.0)
    >>> c = conclude(d.stamped(0, 100_000), [UrlResult("u", 503, Failure.SERVER_ERROR)], s, 0.0, 0.5)
    >>> c.outcome, c.delivery.tier, c.delivery.not_before
    (<Outcome.RETRY: 'retry'>, 0, 10500)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from pipeline.core.config import Destination
from pipeline.core.outcomes import DeadLetterReason, Failure, Outcome, UrlResult, decide
from pipeline.core.records import Attempt, Delivery
from pipeline.core.retry_schedule import RetrySchedule

__all__ = ["Go", "Conclusion", "before_attempt", "conclude", "attempt_entries"]

#: The circuits' answer for a destination: every webhook's refusal when all circuits are open,
#: else ``None`` (``WebhookSender.refused_by_circuits``).
Circuits = Callable[[Destination], Sequence[UrlResult] | None]

DEADLINE_PASSED = "the deadline passed before this attempt could start"


class Go(NamedTuple):
    """Make the request: ``delivery`` (stamped at its first attempt) to ``destination``."""

    delivery: Delivery
    destination: Destination
    final: bool
    """The record's last slot before its deadline: tried even through open circuits."""


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


def before_attempt(
    delivery: Delivery,
    destination: Destination | None,
    schedule: RetrySchedule,
    now: float,
    circuits: Circuits,
) -> Go | Conclusion:
    """Whether to make the request for a due ``delivery`` at ``now`` (epoch seconds), given its
    destination in the live config (``None``: deleted)."""
    if destination is None or not destination.enabled:
        reason = (
            DeadLetterReason.DESTINATION_DELETED
            if destination is None
            else DeadLetterReason.DESTINATION_DISABLED
        )
        return Conclusion(Outcome.DEAD_LETTER, delivery, reason)
    first = delivery.first_attempt_at
    if first is None:
        first = int(now * 1000)
        delivery = delivery.stamped(first, int(schedule.deadline_at(now) * 1000))
    elif not schedule.may_attempt(first_attempt_at=first / 1000, now=now):
        return Conclusion(
            Outcome.DEAD_LETTER, delivery, DeadLetterReason.DEADLINE_EXCEEDED, DEADLINE_PASSED
        )
    # The last slot before the deadline is a record's final chance: it is always tried, even
    # through an open circuit (which would otherwise decide it without a request).
    final = now >= schedule.last_slot(first / 1000)
    if not final:
        refused = circuits(destination)
        if refused is not None:
            return conclude(delivery, refused, schedule, now, now)
    return Go(delivery, destination, final)


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
