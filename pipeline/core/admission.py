"""Admission: what becomes of a record that is due, decided from its destination, the health of
its endpoints, what is in flight, and the time. Pure logic.

``admit`` answers one of:

- ``Reject``: dead-letter it without an attempt: its destination was deleted or disabled
  (``destination_deleted`` / ``_disabled``), or its deadline passed (``deadline_exceeded``);
- ``Attempt``: make the request now; ``final`` when it is the record's last slot before its
  deadline (made even through open circuits, never parked: no record is dead-lettered without a
  last request);
- ``Park``: its destination cannot take it now, so it waits in a retry tier as it is, undecoded,
  until it can (``park_reasons``, in the order they are asked: its receiver asked for a pause
  (``Retry-After``), its ``max_in_flight`` taken, every webhook's circuit open, every webhook
  silent, its first requests unanswered with as many records out as its host has connections,
  its turn under ``rate_limit`` more than half a second off: back within half a second; a record
  that waits by choice (``max_in_flight``, ``rate_limit``) while enough records come back soon
  to keep it busy comes back later, ``QUEUE_LONG``);
- ``Refused``: with parking off, every webhook's circuit is open: the attempt is concluded from
  their refusals without a request (a retry).

While a destination's circuits are open, one parked record comes back when they may be tried
again, to carry the probe (``carries_probe``); the others come back once the probe has answered,
so a long outage moves each parked record once per cool-down.

    >>> from pipeline.core.config import Destination
    >>> from pipeline.core.endpoint_health import Health
    >>> from pipeline.core.retry_schedule import RetrySchedule
    >>> hooks = Destination(id="h", sources=["s"], webhooks=[{"url": "https://a.example/"}])
    >>> schedule = RetrySchedule(delays=(10.0,), deadline=100.0, jitter=0.0)
    >>> str(admit(hooks, Health(reopens_in=30.0), 0, FRESH, schedule, 0.0).reason)
    'circuit_open'
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import NamedTuple

from pipeline.core.config import Destination
from pipeline.core.delivery_policy import DEADLINE_PASSED, park
from pipeline.core.endpoint_health import Health
from pipeline.core.outcomes import DeadLetterReason
from pipeline.core.records import Delivery
from pipeline.core.retry_schedule import RetrySchedule

__all__ = [
    "Admission",
    "Attempt",
    "FRESH",
    "Limits",
    "Park",
    "ParkReason",
    "Refused",
    "Reject",
    "WAITS_BY_CHOICE",
    "Window",
    "admit",
    "window_of",
]

#: A destination at its ``max_in_flight`` (or its unanswered limit): its next records wait this
#: long in the first tier.
IN_FLIGHT_WAIT = 1.0
#: Past its ``max_in_flight``, records also wait here for a free slot (the sender holds them),
#: as many as free up in ``IN_FLIGHT_WAIT`` at the pace its receiver accepted lately (as many as
#: it has slots while that is unknown), up to this many: parked all, they came back a second
#: later, and a destination with a backlog sent ``max_in_flight`` records a second however fast
#: its receiver (2/s of a receiver taking 10).
IN_FLIGHT_ROOM_MAX = 100
#: Parked records wait at least this long (a circuit about to half-open).
MIN_PARK_WAIT = 1.0
#: A record whose turn under ``rate_limit`` is further off than this is parked rather than held in
#: an in-flight slot (its turn is taken when it is admitted: a turn held is a turn spent here,
#: whatever the shares of the processes become).
RATE_WAIT_IN_FLIGHT = 0.5
#: A record parked for its turn comes back this long before the records held in flight have all
#: had theirs (the hand-off through a retry tier takes a moment, and the turns must not idle),
#: and at most ``RATE_PARK_MAX`` after it was parked: the shares of the processes change at every
#: report (``pace.INTERVAL``), and a turn reckoned at a small share would be late at a larger one.
RATE_PARK_LEAD = 0.25
RATE_PARK_MAX = 0.5
#: A record that waits by choice (its turn under ``rate_limit``, a free slot under
#: ``max_in_flight``) while the records parked here to come back within a second or two (the
#: queue's head, ``Health.queue``) hold this many seconds of its group's pace waits longer:
#: until ``QUEUE_KEEP`` is left of all those parked here ahead of it (``Health.behind``), at most
#: ``QUEUE_MAX_WAIT`` (a raised ``rate_limit`` or a faster receiver is heard by then), in the tier
#: whose delay covers the wait, never past the last's. So the head holds 30 s of the pace, and
#: the rest of a long backlog goes round the tier once a minute, not all of it twice a second
#: (30,000 calls at 10/s: 96,000 records parked again a second, 54 MB/s written to the tier) or,
#: at its ``max_in_flight``, once a second.
QUEUE_LONG = 30.0
QUEUE_KEEP = 15.0
QUEUE_MAX_WAIT = 60.0
#: A silent destination's records wait until its requests out have timed out, this at least.
SILENT_WAIT = 1.0
#: A carried probe has been answered this long after the reopening at the latest, past the
#: delivery timeout (``Limits.probe_answered``).
PROBE_HEARD_AFTER = 0.5


class ParkReason(enum.StrEnum):
    """Why a record was parked (the ``reason`` label of ``pipeline_parked_total``)."""

    IN_FLIGHT = "in_flight"
    """Its destination's ``max_in_flight`` is taken."""
    CIRCUIT_OPEN = "circuit_open"
    """Every webhook's circuit (or its host's) is open."""
    SILENT = "silent"
    """Every webhook has requests out and answered none lately."""
    BACK_OFF = "back_off"
    """Its receiver asked for a pause (429 or 503 with ``Retry-After``)."""
    UNANSWERED = "unanswered"
    """Its first requests are unanswered and its host's connections' worth of records are out."""
    RATE_LIMITED = "rate_limited"
    """Its turn under ``rate_limit`` is more than half a second off."""


#: Waits its owner or its receiver chose (a ``rate_limit``, a ``max_in_flight``, a
#: ``Retry-After``), not failures: they do not start a never-attempted record's retry window, so
#: a backlog longer than the window drains at the chosen pace rather than have its final attempts
#: break it (or be dead-lettered). A failure's wait (an open circuit, silence) starts it.
WAITS_BY_CHOICE = frozenset({ParkReason.BACK_OFF, ParkReason.IN_FLIGHT, ParkReason.RATE_LIMITED})
#: The waits a record may make behind a queue (``QUEUE_LONG``).
QUEUED = frozenset({ParkReason.IN_FLIGHT, ParkReason.RATE_LIMITED})


class Window(NamedTuple):
    """A record's retry window, epoch ms: when its first attempt was and its deadline (``None``:
    never attempted; the window starts when it is first attempted or parked for a failure)."""

    first_attempt_at: int | None
    deadline: int | None


#: The window of a record never attempted.
FRESH = Window(None, None)


def window_of(delivery: Delivery) -> Window:
    """``delivery``'s retry window."""
    return Window(delivery.first_attempt_at, delivery.deadline)


class Attempt(NamedTuple):
    """Make the request; ``first_attempt_at`` and ``deadline`` stamp a first attempt."""

    first_attempt_at: int
    deadline: int
    final: bool


class Park(NamedTuple):
    """Wait in retry tier ``tier`` until ``not_before`` (epoch ms), the retry window carried
    along (``None``: a record never attempted that waits by choice, ``WAITS_BY_CHOICE``: its
    clock has not started); ``carries_probe``: it comes back alone, to carry the probe of a
    reopening circuit."""

    reason: ParkReason
    tier: int
    not_before: int
    first_attempt_at: int | None
    deadline: int | None
    carries_probe: bool = False


class Reject(NamedTuple):
    """Dead-letter it without an attempt."""

    reason: DeadLetterReason
    detail: str = ""


class Refused(NamedTuple):
    """Every webhook's circuit refuses (parking off): concluded from the refusals, as an attempt
    in the window ``first_attempt_at`` to ``deadline``."""

    first_attempt_at: int
    deadline: int


Admission = Attempt | Park | Reject | Refused


@dataclass(frozen=True, slots=True)
class Limits:
    """The worker's settings admission reads: ``parking`` (``PIPELINE_PARKING``);
    ``unanswered``: records an unproven destination may have out (its host's connections);
    ``probe_answered``: how long after a reopening its probe has been answered at the latest."""

    parking: bool = True
    unanswered: int = 100
    probe_answered: float = 5.0 + PROBE_HEARD_AFTER


def admit(
    destination: Destination | None,
    health: Health,
    in_flight: int,
    window: Window,
    schedule: RetrySchedule,
    now: float,
    limits: Limits = Limits(),  # noqa: B008 (frozen, shared)
    *,
    probe_carried_at: float | None = None,
    reasons: frozenset[ParkReason] | None = None,
) -> Admission:
    """What becomes of a due record of ``destination`` (``None``: deleted) at ``now`` (epoch
    seconds). ``health``: the destination's (``EndpointHealth.snapshot``); ``in_flight``: its
    records being attempted here; ``probe_carried_at``: the reopening a parked record already
    comes back for, to carry the probe; ``reasons``: park only for these."""
    if destination is None:
        return Reject(DeadLetterReason.DESTINATION_DELETED)
    if not destination.enabled:
        return Reject(DeadLetterReason.DESTINATION_DISABLED)
    first, deadline = window
    if first is None:
        first = int(now * 1000)
    elif not schedule.may_attempt(first_attempt_at=first / 1000, now=now):
        return Reject(DeadLetterReason.DEADLINE_EXCEEDED, DEADLINE_PASSED)
    if deadline is None:
        deadline = int(schedule.deadline_at(first / 1000) * 1000)
    if now >= schedule.last_slot(first / 1000):
        return Attempt(first, deadline, final=True)
    why = _park_reason(destination, health, in_flight, limits)
    if why is not None and (reasons is None or why[0] in reasons):
        reason, wait = why
        if reason in QUEUED:  # behind a queue: never past the last tier's delay
            wait = min(wait, schedule.longest_wait)
        carries = False
        if reason is ParkReason.CIRCUIT_OPEN:
            reopens_at = now + wait
            if probe_carried_at is None or abs(probe_carried_at - reopens_at) > 1.0:
                carries = True
            else:
                wait += limits.probe_answered
        parked = park(first, deadline, schedule, now, wait)
        if parked is not None:
            if window.first_attempt_at is None and reason in WAITS_BY_CHOICE:
                return Park(reason, parked.tier, parked.not_before, None, None)
            return Park(
                reason, parked.tier, parked.not_before, first, deadline, carries_probe=carries
            )
    if not limits.parking and health.reopens_in is not None:
        return Refused(first, deadline)
    return Attempt(first, deadline, final=False)


def _park_reason(
    destination: Destination, health: Health, in_flight: int, limits: Limits
) -> tuple[ParkReason, float] | None:
    """Why (and for how many seconds) records for ``destination`` should wait rather than be
    attempted now."""
    if not limits.parking:
        return None
    if health.paused_for > 0:
        return ParkReason.BACK_OFF, max(MIN_PARK_WAIT, health.paused_for)
    limit = destination.max_in_flight
    if limit is not None and in_flight >= limit + in_flight_room(destination, health):
        return ParkReason.IN_FLIGHT, _queued(health) or IN_FLIGHT_WAIT
    if health.reopens_in is not None:
        return ParkReason.CIRCUIT_OPEN, max(MIN_PARK_WAIT, health.reopens_in)
    if health.silence_ends_in is not None:
        return ParkReason.SILENT, max(SILENT_WAIT, health.silence_ends_in)
    requests = in_flight  # what the destination has out, in requests
    if destination.batch is not None:  # a batching destination's calls go max_events a request
        requests = -(-in_flight // destination.batch.max_events)
    if requests >= limits.unanswered and health.unproven:
        return ParkReason.UNANSWERED, IN_FLIGHT_WAIT
    if health.rate_wait > RATE_WAIT_IN_FLIGHT:
        wait = min(max(health.rate_wait - RATE_PARK_LEAD, RATE_PARK_LEAD), RATE_PARK_MAX)
        return ParkReason.RATE_LIMITED, _queued(health) or wait
    return None


def in_flight_room(destination: Destination, health: Health) -> int:
    """How many records of ``destination`` may wait here for a slot under its
    ``max_in_flight`` (``IN_FLIGHT_ROOM_MAX``); a batching destination's none (its calls are
    counted, not its requests).

    >>> from pipeline.core.config import Destination
    >>> hooks = Destination(id="h", sources=["s"], webhooks=[{"url": "https://a.example/"}],
    ...                     max_in_flight=5)
    >>> in_flight_room(hooks, Health()), in_flight_room(hooks, Health(accepting=40.0))
    (5, 50)
    """
    if destination.batch is not None or destination.max_in_flight is None:
        return 0
    paced = math.ceil(health.accepting * IN_FLIGHT_WAIT * 1.25)
    return max(destination.max_in_flight, min(paced, IN_FLIGHT_ROOM_MAX))


def _queued(health: Health) -> float | None:
    """How long a record waits behind the records parked by choice ahead of it, when their
    head is long (``QUEUE_LONG``; ``None``: it is not)."""
    if health.queue > QUEUE_LONG:
        return min(health.behind - QUEUE_KEEP, QUEUE_MAX_WAIT)  # behind >= queue: over 15 s
    return None
