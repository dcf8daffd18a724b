"""``pipeline.core.admission.admit``: every branch, from a table (no Kafka, no HTTP: the health
of the endpoints, what is in flight and the clock are arguments)."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.core.admission import (
    FRESH,
    IN_FLIGHT_WAIT,
    MIN_PARK_WAIT,
    QUEUE_KEEP,
    QUEUE_LONG,
    QUEUE_MAX_WAIT,
    RATE_WAIT_IN_FLIGHT,
    SILENT_WAIT,
    Attempt,
    Limits,
    Park,
    ParkReason,
    Refused,
    Reject,
    Window,
    admit,
)
from pipeline.core.config import Batch, Destination
from pipeline.core.delivery_policy import DEADLINE_PASSED
from pipeline.core.endpoint_health import Health
from pipeline.core.outcomes import DeadLetterReason
from pipeline.core.retry_schedule import RetrySchedule

#: Tiers after 10 s, then 60 s; the deadline 1000 s after the first attempt; the last slot at 999 s.
SCHEDULE = RetrySchedule(delays=(10.0, 60.0), deadline=1000.0, jitter=0.0)
T0 = 1_800_000_000.0
T0_MS = int(T0 * 1000)
DEADLINE_MS = T0_MS + 1_000_000
HOOKS = Destination(id="hooks", sources=["web"], webhooks=[{"url": "https://a.example/h"}])  # type: ignore[list-item]
LIMITED = HOOKS.model_copy(update={"max_in_flight": 2})
OFF = HOOKS.model_copy(update={"enabled": False})
BATCHED = HOOKS.model_copy(update={"batch": Batch(max_events=10)})
STAMPED = Window(T0_MS, DEADLINE_MS)
HEALTHY = Health()
LIMITS = Limits(parking=True, unanswered=100, probe_answered=5.5)

#: (name, destination, health, in flight, window, now, limits, expected)
# fmt: off
CASES: list[tuple[str, Any, Health, int, Window, float, Limits, Any]] = [
    ("deleted", None, HEALTHY, 0, FRESH, T0, LIMITS,
     Reject(DeadLetterReason.DESTINATION_DELETED)),
    ("disabled", OFF, HEALTHY, 0, STAMPED, T0 + 5, LIMITS,
     Reject(DeadLetterReason.DESTINATION_DISABLED)),
    ("past the deadline", HOOKS, HEALTHY, 0, STAMPED, T0 + 1000.001, LIMITS,
     Reject(DeadLetterReason.DEADLINE_EXCEEDED, DEADLINE_PASSED)),
    ("at the deadline itself: the final attempt", HOOKS, HEALTHY, 0, STAMPED, T0 + 1000.0,
     LIMITS, Attempt(T0_MS, DEADLINE_MS, final=True)),
    ("a first attempt stamps its window", HOOKS, HEALTHY, 0, FRESH, T0, LIMITS,
     Attempt(T0_MS, DEADLINE_MS, final=False)),
    ("a later attempt keeps its window", HOOKS, HEALTHY, 0, STAMPED, T0 + 70, LIMITS,
     Attempt(T0_MS, DEADLINE_MS, final=False)),
    ("just before the last slot: not final", HOOKS, HEALTHY, 0, STAMPED, T0 + 998.9, LIMITS,
     Attempt(T0_MS, DEADLINE_MS, final=False)),
    ("the last slot goes through open circuits", HOOKS, Health(reopens_in=30.0), 0, STAMPED,
     T0 + 999.0, LIMITS, Attempt(T0_MS, DEADLINE_MS, final=True)),
    # Past max_in_flight (2), as many more wait for a slot while its receiver's pace is unknown,
    # and as many as free up in a second at its pace (1.25 x) when it is known.
    ("max_in_flight taken, and as many waiting", LIMITED, HEALTHY, 4, STAMPED, T0 + 70, LIMITS,
     Park(ParkReason.IN_FLIGHT, 0, int((T0 + 70 + IN_FLIGHT_WAIT) * 1000), T0_MS, DEADLINE_MS)),
    ("max_in_flight taken: it waits for a slot", LIMITED, HEALTHY, 3, STAMPED, T0 + 70, LIMITS,
     Attempt(T0_MS, DEADLINE_MS, final=False)),
    ("max_in_flight taken, a second's worth waiting", LIMITED, Health(accepting=8.0), 12,
     STAMPED, T0 + 70, LIMITS,
     Park(ParkReason.IN_FLIGHT, 0, int((T0 + 70 + IN_FLIGHT_WAIT) * 1000), T0_MS, DEADLINE_MS)),
    ("max_in_flight taken, less than a second's worth waiting", LIMITED, Health(accepting=8.0),
     11, STAMPED, T0 + 70, LIMITS, Attempt(T0_MS, DEADLINE_MS, final=False)),
    ("max_in_flight not taken", LIMITED, HEALTHY, 1, STAMPED, T0 + 70, LIMITS,
     Attempt(T0_MS, DEADLINE_MS, final=False)),
    ("every circuit open: the first carries the probe", HOOKS, Health(reopens_in=30.0), 0, FRESH,
     T0, LIMITS,
     Park(ParkReason.CIRCUIT_OPEN, 1, T0_MS + 30_000, T0_MS, DEADLINE_MS, carries_probe=True)),
    ("a circuit about to reopen: parked the least", HOOKS, Health(reopens_in=0.2), 0, FRESH, T0,
     LIMITS, Park(ParkReason.CIRCUIT_OPEN, 0, int((T0 + MIN_PARK_WAIT) * 1000), T0_MS,
                  DEADLINE_MS, carries_probe=True)),
    ("silent", HOOKS, Health(silence_ends_in=3.0), 0, FRESH, T0, LIMITS,
     Park(ParkReason.SILENT, 0, T0_MS + 3_000, T0_MS, DEADLINE_MS)),
    ("silent, about to be heard: parked the least", HOOKS, Health(silence_ends_in=0.1), 0, FRESH,
     T0, LIMITS, Park(ParkReason.SILENT, 0, int((T0 + SILENT_WAIT) * 1000), T0_MS, DEADLINE_MS)),
    ("unproven with its host's connections out", HOOKS, Health(unproven=True), 100, FRESH, T0,
     LIMITS, Park(ParkReason.UNANSWERED, 0, int((T0 + IN_FLIGHT_WAIT) * 1000), T0_MS,
                  DEADLINE_MS)),
    ("unproven with room left", HOOKS, Health(unproven=True), 99, FRESH, T0, LIMITS,
     Attempt(T0_MS, DEADLINE_MS, final=False)),
    # A batching destination's calls go max_events (10) a request: 990 calls are 99 requests.
    ("unproven, batching, with room left", BATCHED, Health(unproven=True), 990, FRESH, T0,
     LIMITS, Attempt(T0_MS, DEADLINE_MS, final=False)),
    ("unproven, batching, its host's connections out", BATCHED, Health(unproven=True), 991,
     FRESH, T0, LIMITS, Park(ParkReason.UNANSWERED, 0, int((T0 + IN_FLIGHT_WAIT) * 1000), T0_MS,
                             DEADLINE_MS)),
    # It comes back within half a second (the shares may change at each report), and a little
    # before its turn when that is sooner, while the records held in flight still have theirs.
    # A wait by choice (a rate limit, max_in_flight, a Retry-After) leaves a fresh record's
    # window unstarted.
    ("its turn far off", HOOKS, Health(rate_wait=4.0), 0, FRESH, T0, LIMITS,
     Park(ParkReason.RATE_LIMITED, 0, T0_MS + 500, None, None)),
    ("its turn far off, attempted before: its window kept", HOOKS, Health(rate_wait=4.0), 0,
     STAMPED, T0 + 70, LIMITS,
     Park(ParkReason.RATE_LIMITED, 0, T0_MS + 70_500, T0_MS, DEADLINE_MS)),
    ("its turn a little off", HOOKS, Health(rate_wait=0.6), 0, FRESH, T0, LIMITS,
     Park(ParkReason.RATE_LIMITED, 0, T0_MS + 350, None, None)),
    ("its receiver asked for a pause", HOOKS, Health(paused_for=30.0), 0, FRESH, T0, LIMITS,
     Park(ParkReason.BACK_OFF, 1, T0_MS + 30_000, None, None)),
    ("max_in_flight taken, never attempted", LIMITED, HEALTHY, 4, FRESH, T0, LIMITS,
     Park(ParkReason.IN_FLIGHT, 0, int((T0 + IN_FLIGHT_WAIT) * 1000), None, None)),
    ("its turn near: attempted (it waits in flight)", HOOKS,
     Health(rate_wait=RATE_WAIT_IN_FLIGHT), 0, FRESH, T0, LIMITS,
     Attempt(T0_MS, DEADLINE_MS, final=False)),
    ("a wait past the last slot is cut to it", HOOKS, Health(silence_ends_in=60.0), 0, STAMPED,
     T0 + 990, LIMITS, Park(ParkReason.SILENT, 1, T0_MS + 999_000, T0_MS, DEADLINE_MS)),
    ("parking off: every circuit open is refused without a request", HOOKS,
     Health(reopens_in=30.0), 0, FRESH, T0, Limits(parking=False), Refused(T0_MS, DEADLINE_MS)),
    ("parking off: never parked", LIMITED, Health(silence_ends_in=3.0), 5, FRESH, T0,
     Limits(parking=False), Attempt(T0_MS, DEADLINE_MS, final=False)),
]
# fmt: on


@pytest.mark.parametrize(
    ("destination", "health", "in_flight", "window", "now", "limits", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_admit(
    destination: Destination | None,
    health: Health,
    in_flight: int,
    window: Window,
    now: float,
    limits: Limits,
    expected: Any,
) -> None:
    assert admit(destination, health, in_flight, window, SCHEDULE, now, limits) == expected


def test_the_records_after_the_probes_carrier_wait_for_its_answer() -> None:
    reopens = Health(reopens_in=30.0)
    carried = admit(HOOKS, reopens, 0, FRESH, SCHEDULE, T0, LIMITS)
    assert isinstance(carried, Park) and carried.carries_probe
    after = admit(HOOKS, reopens, 0, FRESH, SCHEDULE, T0, LIMITS, probe_carried_at=T0 + 30.0)
    assert after == Park(ParkReason.CIRCUIT_OPEN, 1, T0_MS + 35_500, T0_MS, DEADLINE_MS)
    # A later reopening (a second later or more) gets a carrier of its own.
    later = admit(HOOKS, reopens, 0, FRESH, SCHEDULE, T0 + 2, LIMITS, probe_carried_at=T0 + 30.0)
    assert isinstance(later, Park) and later.carries_probe


def test_only_the_reasons_asked_for_park() -> None:
    at_routing = frozenset({ParkReason.CIRCUIT_OPEN, ParkReason.SILENT, ParkReason.UNANSWERED})
    over_rate = admit(HOOKS, Health(rate_wait=4.0), 0, FRESH, SCHEDULE, T0, reasons=at_routing)
    assert over_rate == Attempt(T0_MS, DEADLINE_MS, final=False)
    down = admit(HOOKS, Health(reopens_in=30.0), 0, FRESH, SCHEDULE, T0, reasons=at_routing)
    assert isinstance(down, Park) and down.reason is ParkReason.CIRCUIT_OPEN


def test_a_record_behind_a_long_head_of_its_queue_waits_longer() -> None:
    """A record whose turn is off, while 40 s of turns are parked here to come back within a
    second or two (the queue's head) and 50 s in all, comes back with ``QUEUE_KEEP`` of them
    left, in the tier whose delay covers the wait (a backlog goes round the tier once a
    minute); behind a short head, within half a second; and no wait is longer than
    ``QUEUE_MAX_WAIT`` or the last tier's delay."""
    queued = Health(rate_wait=4.0, queue=40.0, behind=50.0)
    far = admit(HOOKS, queued, 0, FRESH, SCHEDULE, T0, LIMITS)
    assert far == Park(
        ParkReason.RATE_LIMITED, 1, T0_MS + int((50.0 - QUEUE_KEEP) * 1000), None, None
    )
    short = Health(rate_wait=4.0, queue=QUEUE_LONG, behind=1_000.0)
    near = admit(HOOKS, short, 0, FRESH, SCHEDULE, T0, LIMITS)
    assert near == Park(ParkReason.RATE_LIMITED, 0, T0_MS + 500, None, None)
    endless = Health(rate_wait=4.0, queue=40.0, behind=10_000.0)
    capped = admit(HOOKS, endless, 0, FRESH, SCHEDULE, T0, LIMITS)
    assert capped == Park(
        ParkReason.RATE_LIMITED, 1, T0_MS + int(QUEUE_MAX_WAIT * 1000), None, None
    )
    short_tiers = RetrySchedule(delays=(1.0, 2.0), deadline=1000.0, jitter=0.0)
    in_short = admit(HOOKS, endless, 0, FRESH, short_tiers, T0, LIMITS)
    assert in_short == Park(ParkReason.RATE_LIMITED, 1, T0_MS + 2000, None, None)
    turn_near = Health(rate_wait=RATE_WAIT_IN_FLIGHT, queue=100.0, behind=100.0)
    assert admit(HOOKS, turn_near, 0, FRESH, SCHEDULE, T0, LIMITS) == Attempt(
        T0_MS, DEADLINE_MS, final=False
    )


def test_a_record_at_max_in_flight_behind_a_long_head_waits_longer() -> None:
    queued = Health(queue=40.0, behind=40.0)
    far = admit(LIMITED, queued, 4, FRESH, SCHEDULE, T0, LIMITS)
    assert far == Park(ParkReason.IN_FLIGHT, 1, T0_MS + int((40.0 - QUEUE_KEEP) * 1000), None, None)
    short = Health(queue=10.0, behind=40.0)
    again = admit(LIMITED, short, 4, FRESH, SCHEDULE, T0, LIMITS)
    assert again == Park(ParkReason.IN_FLIGHT, 0, int((T0 + IN_FLIGHT_WAIT) * 1000), None, None)
