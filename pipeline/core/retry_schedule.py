"""When a failed delivery is tried again. Pure logic; the clock and the randomness are arguments.

Tiers: ``delays[0]`` after the first failure, ``delays[1]`` after the second, ..., the last delay
repeating. Each delay gets ±``jitter`` (10 %) so that a burst of failures does not come back as a
burst. A ``Retry-After`` from the receiver lengthens the delay when it still falls inside the deadline.

The deadline is ``deadline`` seconds after the first attempt. No attempt starts after it. A retry
that would fall after the *last slot* (``deadline - margin``) is clamped to it, so the final attempt
runs just before the deadline rather than being lost to scheduling delay; a failure at or after the
last slot goes to the dead-letter topic (``deadline_exceeded``).

    >>> s = RetrySchedule(delays=(10.0, 60.0), deadline=100.0, jitter=0.0)
    >>> s.next_retry(first_attempt_at=0.0, now=0.0, tier=-1)
    Retry(tier=0, not_before=10.0)
    >>> s.next_retry(first_attempt_at=0.0, now=70.0, tier=1)  # clamped to the last slot
    Retry(tier=1, not_before=99.0)
    >>> s.next_retry(first_attempt_at=0.0, now=99.0, tier=1) is None
    True

A destination's own delays (its ``retry`` policy) still go through the retry tier topics, whose
delays are the global ones (``tier_delays``): the n-th retry waits the destination's n-th delay,
in the tier with the longest delay not over it. A tier's consumer waits for the record at its
head, so a record there holds back the ones behind it by at most the gap to the next tier's
delay; tiers are never taken early.

    >>> own = RetrySchedule(delays=(45.0, 600.0), deadline=3600.0, jitter=0.0,
    ...                     tier_delays=(10.0, 60.0, 300.0))
    >>> own.next_retry(first_attempt_at=0.0, now=0.0, tier=-1, tried_before=0)
    Retry(tier=0, not_before=45.0)
    >>> own.next_retry(first_attempt_at=0.0, now=45.0, tier=0, tried_before=1)
    Retry(tier=2, not_before=645.0)
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Retry", "RetrySchedule"]


@dataclass(frozen=True, slots=True)
class Retry:
    """Try again from retry tier ``tier``, not before ``not_before`` (epoch seconds)."""

    tier: int
    not_before: float


@dataclass(frozen=True, slots=True)
class RetrySchedule:
    delays: tuple[float, ...] = (10.0, 60.0, 300.0, 1800.0, 3600.0)
    deadline: float = 4 * 3600.0
    jitter: float = 0.1
    #: The retry tier topics' delays, when ``delays`` are a destination's own (see above);
    #: ``None``: ``delays`` are the tiers' (tier n waits delay n).
    tier_delays: tuple[float, ...] | None = None

    def for_policy(self, delays: Sequence[float] | None, deadline: float | None) -> RetrySchedule:
        """This (global) schedule with a destination's own delays and deadline, where given."""
        if delays is None and deadline is None:
            return self
        return RetrySchedule(
            tuple(delays) if delays is not None else self.delays,
            deadline if deadline is not None else self.deadline,
            self.jitter,
            self.delays if delays is not None else None,
        )

    @property
    def margin(self) -> float:
        """How far before the deadline the last slot lies: 1 s, or a tenth of a short deadline."""
        return min(1.0, self.deadline / 10)

    def deadline_at(self, first_attempt_at: float) -> float:
        return first_attempt_at + self.deadline

    def last_slot(self, first_attempt_at: float) -> float:
        """When a record's final attempt is due: ``margin`` before its deadline."""
        return self.deadline_at(first_attempt_at) - self.margin

    def next_retry(
        self,
        *,
        first_attempt_at: float,
        now: float,
        tier: int,
        retry_after: float | None = None,
        uniform: Callable[[float, float], float] = random.uniform,
        tried_before: int = 0,
    ) -> Retry | None:
        """The next try after a retryable failure at ``now`` in ``tier`` (-1: the main topic),
        the record having been tried ``tried_before`` times before this failure (it picks the
        delay when the delays are a destination's own).

        ``None`` means the deadline leaves no room for another try.
        """
        last_slot = self.last_slot(first_attempt_at)
        if now >= last_slot:
            return None
        if self.tier_delays is None:
            next_tier = index = min(tier + 1, len(self.delays) - 1)
        else:
            index = min(tried_before, len(self.delays) - 1)
            next_tier = _tier_for(self.delays[index], self.tier_delays)
        base = self.delays[index]
        delay = base * (1.0 + uniform(-self.jitter, self.jitter))
        if retry_after is not None and retry_after > delay and now + retry_after <= last_slot:
            delay = retry_after
        return Retry(next_tier, min(now + delay, last_slot))

    def tier_for_wait(self, wait: float) -> int:
        """The retry tier a parked record waiting ``wait`` seconds goes to: the one with the
        shortest delay not under it (the last if every one is). Its ``notBefore`` then comes no
        later than the records' behind it, so it holds none of them back; it may wait behind
        the records ahead of it, at most the tier's delay.

        The other way round (the longest delay not over it, as for a destination's own delays)
        put a circuit's 30 s parks in the 10 s tier, and a destination parked there for a second
        (silent, at its ``max_in_flight``) waited up to 30 s behind them.

        >>> s = RetrySchedule(delays=(10.0, 60.0, 300.0))
        >>> s.tier_for_wait(1.0), s.tier_for_wait(10.0), s.tier_for_wait(30.0), s.tier_for_wait(900)
        (0, 0, 1, 2)
        """
        delays = self.tier_delays if self.tier_delays is not None else self.delays
        for tier, delay in enumerate(delays):
            if delay >= wait:
                return tier
        return len(delays) - 1

    @property
    def longest_wait(self) -> float:
        """The longest a record waits in a tier by choice (the last tier's delay): longer, it
        would hold back the records behind it."""
        return max(self.tier_delays if self.tier_delays is not None else self.delays)

    def may_attempt(self, *, first_attempt_at: float | None, now: float) -> bool:
        """No attempt starts after the deadline."""
        return first_attempt_at is None or now <= self.deadline_at(first_attempt_at)


def _tier_for(delay: float, tier_delays: tuple[float, ...]) -> int:
    """The tier with the longest delay not over ``delay`` (the first if every one is)."""
    tier = 0
    for index, tier_delay in enumerate(tier_delays):
        if tier_delay <= delay:
            tier = index
    return tier
