"""Parking: a delivery record its destination cannot take now waits in a retry tier as it is,
undecoded, until it can.

Everything about it is here: the schedule header, the plans, the batching of parked records,
and the parker the router asks at routing time (the router depends on this module, not on the
delivery handler).

**One schedule per waiting record.** Every record in a retry tier carries a ``pipeline-schedule``
header: its tier, when it is due, its retry window (first attempt, deadline) and its destination
(``Schedule``). It is the record's schedule; its value holds the call and its attempts, and its
own schedule fields are not read (a parked record's value is as it was when it was first parked:
that is what makes parking cheap). Retries write the header as parking does. A record without
the header (on ``deliveries``, never attempted; or written by an older version) is scheduled by
its value.

**Parked together, carried as one**: ``pipeline.roles.parked_batches``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from pipeline.core.admission import (
    FRESH,
    MIN_PARK_WAIT,
    Admission,
    Limits,
    Park,
    ParkReason,
    Window,
    admit,
)
from pipeline.core.config import Destination
from pipeline.core.endpoint_health import EndpointHealth, Health
from pipeline.core.pace import PaceBook
from pipeline.core.records import Delivery
from pipeline.core.retry_schedule import RetrySchedule
from pipeline.core.topics import Topics
from pipeline.kafka.errors import Headed, Placed, Produced
from pipeline.roles.delivery_tracing import wait_header
from pipeline.roles.parked_batches import (
    MAX_BYTES,
    PARTS_HEADER,
    PARTS_TRACE_HEADER,
    Headers,
    PartMessage,
    carried_trace,
    entry_size,
    packed,
    split_first,
    trace_entries,
    trace_of,
    unpacked,
)
from pipeline.runtime.tracing import TraceHeaders

__all__ = [
    "SCHEDULE_HEADER",
    "PARTS_HEADER",
    "PARTS_TRACE_HEADER",
    "Headers",
    "trace_of",
    "trace_entries",
    "MAX_BYTES",
    "AT_ROUTING",
    "Schedule",
    "ParkPlan",
    "Parking",
    "ParkingBatch",
    "RoutingParker",
    "PartMessage",
    "schedule_of",
    "schedule_header",
    "packed",
    "unpacked",
    "split_first",
    "entry_size",
]

#: The header of every record in a retry tier: ``tier not_before first_attempt_at deadline
#: destination`` (ASCII; epoch ms).
SCHEDULE_HEADER = "pipeline-schedule"
#: Its name before it was written on retries too (still read).
_PARK_HEADER = "pipeline-park"


#: Why the router parks a fresh record itself: its destination's endpoints are down or hang, or
#: its receiver asked for a pause. A destination at its in-flight limit or over its rate is
#: decided on arrival, where the records ahead of it have been counted (the router runs ahead of
#: delivery).
AT_ROUTING = frozenset(
    {ParkReason.CIRCUIT_OPEN, ParkReason.SILENT, ParkReason.UNANSWERED, ParkReason.BACK_OFF}
)

#: A parked-record counter (``pipeline_parked_total`` of one destination and reason).
Counter = Any

# ---- the schedule header -------------------------------------------------------------------------


class Schedule(NamedTuple):
    """A waiting record's schedule: retry tier ``tier``, due at ``not_before``, its retry window
    (``first_attempt_at``, ``deadline``; epoch ms) and its destination; ``parts``: how many
    records it carries (0: itself alone)."""

    tier: int
    not_before: int
    first_attempt_at: int
    deadline: int
    destination: str
    parts: int = 0

    @property
    def window(self) -> Window:
        """Its retry window (0 in the header: not started, ``admission.WAITS_BY_CHOICE``)."""
        return Window(self.first_attempt_at or None, self.deadline or None)

    def header(self) -> tuple[str, bytes]:
        return schedule_header(
            self.tier, self.not_before, self.first_attempt_at, self.deadline, self.destination
        )

    def applied_to(self, record: Delivery) -> Delivery:
        """The decoded ``record`` with this schedule (the value's own fields are not read)."""
        first_attempt_at, deadline = self.window
        return record._replace(
            tier=self.tier,
            not_before=self.not_before,
            first_attempt_at=first_attempt_at,
            deadline=deadline,
        )


def schedule_header(
    tier: int,
    not_before: int,
    first_attempt_at: int | None,
    deadline: int | None,
    destination: str,
) -> tuple[str, bytes]:
    value = f"{tier} {not_before} {first_attempt_at or 0} {deadline or 0} {destination}"
    return (SCHEDULE_HEADER, value.encode())


def schedule_of(message: Any) -> Schedule | None:
    """The schedule header of a consumed record (``None``: it has none, or one not ours)."""
    headers = message.headers()  # a list of (name, bytes) on consumed records
    if not headers:
        return None
    found = None
    parts = 0
    for name, value in headers:
        if (name == SCHEDULE_HEADER or name == _PARK_HEADER) and isinstance(value, bytes):
            try:
                tier, not_before, first, deadline, destination = value.split(b" ", 4)
                found = Schedule(
                    int(tier), int(not_before), int(first), int(deadline), destination.decode()
                )
            except ValueError:
                return None  # not ours: the value decides
        elif name == PARTS_HEADER and isinstance(value, bytes) and value.isdigit():
            parts = int(value)
    if found is not None and parts:
        return found._replace(parts=parts)
    return found


# ---- plans ---------------------------------------------------------------------------------------


class ParkPlan(NamedTuple):
    """Where a parked record goes and its schedule header; ``counter``: the count of records
    parked for its destination and reason; ``carries_probe``: it comes back alone (the plan
    holds for no other record); ``partition``: the tier's partition (``None``: by key)."""

    topic: str
    headers: Headers
    counter: Counter
    carries_probe: bool
    partition: int | None = None

    def parked_record(
        self, key: bytes | None, value: bytes | None, parts: int = 0, trace: TraceHeaders = ()
    ) -> Headed | Placed:
        """The record (``key``, ``value``; a batch of ``parts`` records, if any; ``trace``: its
        trace context, ``trace_of``) parked by this plan, counted: the same bytes, the plan in
        a header."""
        self.counter.inc(parts or 1)
        headers = self._headers_of(parts) if parts else self.headers
        return self._record(key, value, [*headers, *trace] if trace else headers)

    def batch(
        self, items: Sequence[tuple[bytes | None, bytes | None, int]], entries: Sequence[bytes]
    ) -> Headed | Placed:
        """One record carrying ``items`` (key, value, parts: 0 for a record alone) and their
        parts' traceparents (``entries``: ``trace_entries``), counted."""
        trace = carried_trace(entries)
        if len(items) == 1:
            return self.parked_record(*items[0], trace)
        parts = sum(count or 1 for _, _, count in items)
        self.counter.inc(parts)
        return self._record(items[0][0], packed(items), [*self._headers_of(parts), *trace])

    def _record(self, key: bytes | None, value: bytes | None, headers: Headers) -> Headed | Placed:
        if self.partition is None:
            return (self.topic, key, value, headers)
        return (self.topic, key, value, headers, self.partition)

    def _headers_of(self, parts: int) -> Headers:
        return [*self.headers, (PARTS_HEADER, b"%d" % parts)]


class _Waiting:
    """The counter of records parked by choice: parked for their turn (in ``place``), they
    count as waiting in the pace's demand too (``PaceBook.waited``), which sets this process's
    share of the rate limit; for a free slot (no ``place``), in its queue only
    (``PaceBook.queued``)."""

    __slots__ = ("_counter", "_pace", "_destination", "_due", "_place")

    def __init__(
        self,
        counter: Counter,
        pace: PaceBook,
        destination: str,
        due: float,
        place: tuple[str, int] | None = None,
    ) -> None:
        self._counter = counter
        self._pace = pace
        self._destination = destination
        self._due = due  # epoch seconds
        self._place = place

    def inc(self, amount: int = 1) -> None:
        self._counter.inc(amount)
        back_in = self._due - time.time()
        if self._place is None:
            self._pace.queued(self._destination, amount, back_in)
        else:
            self._pace.waited(self._destination, amount, back_in, self._place)


class Parking:
    """Parking in one process: admissions with the probe carriers remembered, and the plans
    they make. ``in_flight``: records being attempted per destination (the delivery handler's
    count, which the router's parker reads too); ``schedules``: a destination's retry schedule;
    ``counters``: the parked-record counter of a destination and reason."""

    def __init__(
        self,
        *,
        health: EndpointHealth,
        in_flight: Mapping[str, int],
        schedules: Callable[[Destination | None], RetrySchedule],
        topics: Topics,
        limits: Limits,
        counters: Callable[[str, ParkReason], Counter],
        tier_partitions: int = 1,
    ) -> None:
        self.health = health
        self.in_flight = in_flight
        self.schedules = schedules
        self.limits = limits
        self._retry_topics = topics.retry
        self._counters = counters
        #: Per destination, the reopening of its circuits a parked record comes back for (to
        #: take the probe); its other records come back once the probe has answered.
        self._carriers: dict[str, float] = {}
        #: How many partitions each retry tier has.
        self.tier_partitions = tier_partitions
        #: Whether this process's retry role holds a partition of a retry tier (the worker
        #: sets it where it runs one).
        self.holds_place: Callable[[tuple[str, int]], bool] = lambda _place: False

    def admit(
        self,
        destination: Destination | None,
        window: Window,
        now: float,
        reasons: frozenset[ParkReason] | None = None,
        health: Health | None = None,
    ) -> Admission:
        """``pipeline.core.admission.admit`` for a record of ``destination`` now (``health``:
        its snapshot, if the caller has one of now)."""
        if destination is None or not destination.enabled:
            health = _NO_HEALTH
        elif health is None:
            health = self.health.snapshot(destination)
        in_flight = 0 if destination is None else self.in_flight.get(destination.id, 0)
        carried = None if destination is None else self._carriers.get(destination.id)
        admission = admit(
            destination,
            health,
            in_flight,
            window,
            self.schedules(destination),
            now,
            self.limits,
            probe_carried_at=carried,
            reasons=reasons,
        )
        if isinstance(admission, Park) and admission.carries_probe:
            assert destination is not None and health.reopens_in is not None
            self._carriers[destination.id] = now + max(MIN_PARK_WAIT, health.reopens_in)
        return admission

    def plan(self, destination: str, park: Park, source: tuple[str, int] | None = None) -> ParkPlan:
        """The plan of a ``Park`` admission for a record of ``destination`` read from ``source``
        (topic, partition; ``None``: by key)."""
        header = schedule_header(
            park.tier, park.not_before, park.first_attempt_at, park.deadline, destination
        )
        topic = self._retry_topics[park.tier]
        counter = self._counters(destination, park.reason)
        partition = None
        if park.reason is ParkReason.RATE_LIMITED and source is not None:
            # Records waiting for their turn go to the tier's partition of the number they were
            # read from, and come back from there round after round: a backlog stays spread
            # over the tier as over the partitions it came from, with the processes that hold
            # them, and a rebalance moves the part whose partition moves, not a process's all.
            # Where this process's retry role holds that partition, they count in its demand
            # (its share of the rate) while out; elsewhere where they come back.
            partition = source[1] % self.tier_partitions
            place = (topic, partition)
            if self.holds_place(place):
                due = park.not_before / 1000
                counter = _Waiting(counter, self.health.pace, destination, due, place)
        elif park.reason is ParkReason.IN_FLIGHT:  # comes back by key: anywhere
            counter = _Waiting(counter, self.health.pace, destination, park.not_before / 1000)
        waits = wait_header(park.reason)
        return ParkPlan(topic, [header, waits], counter, park.carries_probe, partition)

    def batch(self, now: float) -> ParkingBatch:
        return ParkingBatch(self, now)

    def routing_parker(self, destinations: Mapping[str, Destination]) -> RoutingParker:
        """The parker of one router batch (see ``RoutingParker``); ``destinations``: the live
        config's."""
        return RoutingParker(ParkingBatch(self, time.time()), destinations)


_NO_HEALTH = Health()


class _ParkedGroup:
    """Records parked by one plan from one partition (``size``: their bytes in a batch);
    ``out`` gets the record carrying them."""

    __slots__ = ("plan", "out", "items", "traces", "size")

    def __init__(self, plan: ParkPlan) -> None:
        self.plan = plan
        self.out: list[Produced] = []
        self.items: list[tuple[bytes | None, bytes | None, int]] = []
        self.traces: list[bytes] = []  # its parts' traceparents (``trace_entries``)
        self.size = 0


class ParkingBatch:
    """The admissions and parked records of one consumed batch.

    Admissions are kept by destination and retry window for the rest of the batch where they
    hold: a plan to park does (nothing it depends on changes while the batch is handled but
    in-flight counts, which grow), unless it carries the probe (only one record does); an answer
    not to park does for records that start no request (``undecoded``). So a hanging
    destination's backlog costs one admission a batch, not one a record.

    Records parked by one plan from one partition go out as one Kafka record carrying them all,
    up to ``MAX_BYTES``: the first one's hand-off produces it (``close``), the others' produce
    nothing, and all are finished when the batch's records are acknowledged."""

    __slots__ = (
        "_parking",
        "_now",
        "_undecoded",
        "_decoded",
        "_healths",
        "_plans",
        "_groups",
        "_all",
    )

    def __init__(self, parking: Parking, now: float) -> None:
        self._parking = parking
        self._now = now
        self._undecoded: dict[tuple[str | None, Window], Admission] = {}
        self._decoded: dict[tuple[str | None, Window], Admission] = {}
        #: Each destination's health as of ``now``: what changes it (answers, pace reports) is
        #: heard between batches, but for the turns taken under a rate limit (``rate_wait``).
        self._healths: dict[str, Health] = {}
        #: The plan of each kept ``Park`` (by its identity; the admission is kept alive here).
        self._plans: dict[tuple[int, tuple[str, int] | None], tuple[Park, ParkPlan]] = {}
        self._groups: dict[tuple[int, object], _ParkedGroup] = {}
        self._all: list[_ParkedGroup] = []

    def admit(
        self, destination: Destination | None, window: Window, *, undecoded: bool
    ) -> Admission:
        """The admission of a record of ``destination`` with ``window``; ``undecoded``: asked
        before its decode, of a record that starts no request either way."""
        kept = self._undecoded if undecoded else self._decoded
        key = (None if destination is None else destination.id, window)
        found = kept.get(key)
        if found is None:
            health = None
            if destination is not None and destination.enabled:
                health = self._health(destination)
            found = self._parking.admit(destination, window, self._now, health=health)
            if isinstance(found, Park):
                if not found.carries_probe:
                    kept[key] = found
            elif undecoded:
                kept[key] = found
        return found

    def _health(self, destination: Destination) -> Health:
        """``destination``'s health as of this batch, its ``rate_wait`` and queue as of now."""
        health = self._parking.health
        found = self._healths.get(destination.id)
        if found is None:
            found = self._healths[destination.id] = health.snapshot(destination)
            return found
        wait = health.rate_wait(destination)
        if wait != found.rate_wait:
            queue, behind = health.queue(destination)
            found = self._healths[destination.id] = replace(
                found, rate_wait=wait, queue=queue, behind=behind
            )
        return found

    def park(
        self,
        destination: Destination,
        park: Park,
        source: object,
        key: bytes | None,
        value: bytes | None,
        parts: int = 0,
        trace: TraceHeaders = (),
    ) -> list[Produced]:
        """Park (``key``, ``value``: a batch of ``parts``, if any; ``trace``: its trace context,
        ``trace_of``) from ``source`` (its partition) as ``park`` says; what its hand-off
        produces (a list ``close`` fills in for the first record of a group). A batch that comes
        back to carry the probe is split: its first record carries it, alone, and the others go
        on together, back once the probe has answered, as the other records of the reopening
        do."""
        if park.carries_probe:
            plan = self._parking.plan(destination.id, park)
            if parts > 1:
                return self._carried_by_first(plan, destination, park, key, value, parts, trace)
            return [plan.parked_record(key, value, parts, trace)]
        place = source if isinstance(source, tuple) else None
        known = self._plans.get((id(park), place))
        if known is None:
            plan = self._parking.plan(destination.id, park, place)
            known = self._plans[(id(park), place)] = (park, plan)
        plan = known[1]
        size = entry_size(key, value)
        group = self._groups.get((id(park), source))
        if group is None or group.size + size > MAX_BYTES:
            group = self._groups[(id(park), source)] = _ParkedGroup(plan)
            self._all.append(group)
            out = group.out
        else:
            out = []
        group.items.append((key, value, parts))
        group.traces += trace_entries(trace, parts)
        group.size += size
        return out

    def park_message(
        self, destination: Destination, park: Park, consumed: Any, parts: int = 0
    ) -> list[Produced]:
        """``park`` a consumed record (``ConsumedRecord``; a batch of ``parts``) as it is."""
        message = consumed.message
        key, value = message.key(), message.value()
        return self.park(destination, park, consumed.key, key, value, parts, trace_of(message))

    def _carried_by_first(
        self,
        plan: ParkPlan,
        destination: Destination,
        park: Park,
        key: bytes | None,
        value: bytes | None,
        parts: int,
        trace: TraceHeaders,
    ) -> list[Produced]:
        try:
            first_key, first_value, rest = split_first(value)
            next_key, next_value, after = split_first(rest)
        except ValueError:  # it will not read back: parked as it is, dead-lettered when due
            return [plan.parked_record(key, value, parts, trace)]
        window = Window(park.first_attempt_at, park.deadline)
        others = self._parking.admit(destination, window, self._now)
        if not isinstance(others, Park) or others.carries_probe:
            return [plan.parked_record(key, value, parts, trace)]
        rest_plan = self._parking.plan(destination.id, others)
        entries = trace_entries(trace, parts)
        rest_trace = carried_trace(entries[1:])
        if after:
            rest_record = rest_plan.parked_record(next_key, rest, parts - 1, rest_trace)
        else:
            rest_record = rest_plan.parked_record(next_key, next_value, 0, rest_trace)
        first = plan.parked_record(first_key, first_value, 0, carried_trace(entries[:1]))
        return [first, rest_record]

    def close(self) -> list[Headed | Placed]:
        """Each group's record, into its first record's hand-off; returned too."""
        made = [group.plan.batch(group.items, group.traces) for group in self._all]
        for group, record in zip(self._all, made, strict=True):
            group.out.append(record)
        self._all.clear()
        self._groups.clear()
        return made


class RoutingParker:
    """Asked by the router of each fresh delivery record of one batch: is it parked? (Then it
    is kept here, and goes out with the others in ``records``: one record per destination.)

    The router parks a record itself when this process would park it on arrival because its
    destination's endpoints are down or hang (``AT_ROUTING``): one produce instead of a produce,
    a consume, a decode and a produce again. The router routes a batch without yielding, so
    nothing the answer depends on changes meanwhile (bar the clock, by milliseconds): it is
    asked once per destination and batch, and kept where it holds. An ordered destination's
    records are never parked here: the first of a user's to wait holds the user's later ones back,
    which only the user's lane knows."""

    __slots__ = ("_batch", "_destinations", "_answers", "_alone", "parked")

    def __init__(self, batch: ParkingBatch, destinations: Mapping[str, Destination]) -> None:
        self._batch = batch
        self._destinations = destinations
        self._answers: dict[str, Park | None] = {}
        self._alone: list[Headed | Placed] = []  # the probe's carriers
        self.parked = 0

    def __call__(
        self, key: bytes | None, value: bytes, destination: str, trace: TraceHeaders = ()
    ) -> bool:
        park = self._answers.get(destination, _UNASKED)
        found = self._destinations.get(destination)
        if found is not None and found.ordered:
            return False  # its user's lane decides (``pipeline.roles.ordering``)
        if park is _UNASKED:
            parking = self._batch._parking
            admission = parking.admit(found, FRESH, self._batch._now, AT_ROUTING)
            park = admission if isinstance(admission, Park) else None
            if park is None or not park.carries_probe:
                self._answers[destination] = park
        if park is None or found is None:
            return False
        if park.carries_probe:
            plan = self._batch._parking.plan(destination, park)
            self._alone.append(plan.parked_record(key, value, 0, trace))
        else:  # its record comes from ``close``
            self._batch.park(found, park, None, key, value, 0, trace)
        self.parked += 1
        return True

    def records(self) -> list[Headed | Placed]:
        """The parked records, batched (once, when the batch is routed)."""
        return [*self._alone, *self._batch.close()]


#: ``RoutingParker``'s answer for a destination it has not asked about yet in its batch.
_UNASKED: Any = object()
