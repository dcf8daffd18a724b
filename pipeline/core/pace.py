"""A destination's pace across the delivery processes of a deployment: their shares of its
``rate_limit``, the pause its receiver asked for, and the lower pace its 429s call for. Pure
logic; the clocks are arguments.

Each process (a *member*) counts, per destination, what it sent and what waited for a turn, and
publishes a ``Report`` every ``INTERVAL`` to a compacted topic that every member follows
(``pipeline.kafka.pace_exchange``). From the live reports each member works out:

- **Its share** of the group's pace: its *demand* (requests sent plus records that had to wait
  for a turn, in its last interval) over the sum of every live member's. The shares add up to 1,
  so with a backlog the receiver sees the whole limit however the partitions are spread; a member
  with nothing waiting asks for what it sends. With no demand anywhere (or no report yet) each
  member sends its partitions' share (``fallback``).
- **A pause**: a 429 or 503 with ``Retry-After`` stops the destination's attempts in every member
  until then (``RETRY_AFTER_MAX`` at most), as soon as the report reaches them.
- **A lower pace** (AIMD): 429s without ``Retry-After`` lower the group's pace, at the end of
  the interval they came in (by then the answers of a burst are all in), to ``DECREASE`` of what
  the receiver accepted lately: the most in any ``ACCEPTED_WINDOW`` of the last
  ``ACCEPTED_MEMORY`` (at most once a ``STEP_EVERY``); each
  ``STEP_EVERY`` without one adds a fixed step (``STEP`` of the lowered pace) until the pace is
  back at ``rate_limit``, or, for an unlimited destination, at least at twice the lowered pace
  and no longer holding anything back (the group asks for less). Members adopt the lowest live
  pace.

    >>> now = [0.0]
    >>> book = PaceBook("a", wall=lambda: 100.0, clock=lambda: now[0])
    >>> book.take(b"hooks\\0b", Report(demand=30, at=100.0).encode())
    >>> for _ in range(10): book.taken("hooks")
    >>> book.share("hooks", fallback=0.5)   # it has not said what it asks yet
    0.0
    >>> now[0] = 1.0; _ = book.tick({"hooks": 40.0})   # 10 in the last second
    >>> round(book.share("hooks", fallback=0.5), 2)   # 10 of 40 asked
    0.25
"""

from __future__ import annotations

import datetime
import heapq
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

import orjson

__all__ = [
    "INTERVAL",
    "PaceBook",
    "PaceChange",
    "PaceView",
    "Report",
    "report_key",
    "split_key",
]

#: How often a member reports: a share is as stale as the last report, and a record parked for
#: its turn comes back at most an interval later (``admission.RATE_PARK_MAX``). Every second
#: lost 1.5-4/s of a 30/s limit across a join (``tests/integration/test_pace.py``).
INTERVAL = 0.5
#: How often a lowered pace steps back up (and at most how often a 429 lowers it).
STEP_EVERY = 1.0
#: A member not heard of for this long (by this member's clock) has left.
LIVE_FOR = 3.5
#: A report older than this by its own timestamp is stale, whatever the clock of its reading.
STALE_AFTER = 60.0
#: The longest pause a ``Retry-After`` makes.
RETRY_AFTER_MAX = 3600.0
#: A 429 lowers the pace to this fraction of what the receiver accepted lately.
DECREASE = 0.9
#: Each ``STEP_EVERY`` without a 429 raises a lowered pace by this fraction of where it was
#: lowered to.
STEP = 0.05
#: The lowest pace a destination is lowered to (requests per second).
MIN_PACE = 1.0
#: What the receiver "accepted lately" is the most 2xx answers in any window of this many
#: seconds (a receiver's "per second" is a window of its own) of the last ``ACCEPTED_MEMORY``:
#: retried records come back in waves, and the last second alone may hold a wave's tail. An
#: interval's count (half a second, cut short by a burst or stretched by a busy loop) read 7/s,
#: and the last second 4/s, of a receiver taking 20 (test_pace.py's 429 test).
ACCEPTED_WINDOW = 1.0
ACCEPTED_MEMORY = 3.0
#: A record parked for its turn is counted out, in its member's demand, until this long after
#: it is due (its way back through the retry tier).
RETURN_ALLOWANCE = 0.5
#: A record parked by choice to come back within this long is at its queue's head (``parked``).
HEAD_WAIT = 2.0


@dataclass(frozen=True, slots=True)
class Report:
    """One member's word on one destination: ``demand`` (requests sent plus records that waited
    for a turn) and ``accepted`` (2xx answers) in its last interval; ``pace`` its lowered pace in
    requests per second (``None``: not lowered); ``paused_until`` (epoch seconds, 0: none);
    ``at`` when it was made (epoch seconds)."""

    demand: float = 0.0
    accepted: float = 0.0
    pace: float | None = None
    paused_until: float = 0.0
    at: float = 0.0

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "demand": self.demand,
                "accepted": self.accepted,
                "pace": self.pace,
                "pausedUntil": self.paused_until,
                "at": self.at,
            }
        )

    @classmethod
    def decode(cls, value: bytes) -> Report:
        """Raises ``ValueError`` for what is not a report."""
        try:
            data = orjson.loads(value)
            pace = data["pace"]
            return cls(
                float(data["demand"]),
                float(data["accepted"]),
                None if pace is None else float(pace),
                float(data["pausedUntil"]),
                float(data["at"]),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a pace report: {exc}") from None


def report_key(destination: str, member: str) -> bytes:
    return f"{destination}\0{member}".encode()


def split_key(key: bytes) -> tuple[str, str] | None:
    destination, sep, member = key.decode(errors="replace").rpartition("\0")
    return (destination, member) if sep else None


@dataclass(frozen=True, slots=True)
class PaceChange:
    """Something this member decided about a destination's pace, for the operational events:
    ``kind`` ``paused`` (``until``, ``status``), ``slowed`` (``pace``) or ``restored``."""

    destination: str
    kind: str
    pace: float | None = None
    until: float = 0.0
    status: int | None = None


@dataclass(frozen=True, slots=True)
class PaceView:
    """What the deployment says of a destination's pace now: ``pace``, the pace its 429s
    lowered it to (requests per second for the whole deployment; ``None``: not lowered);
    ``paused_until``: the end of the pause its receiver asked for (epoch seconds; 0: none)."""

    pace: float | None = None
    paused_until: float = 0.0

    def text(self, now: float) -> str | None:
        """A line for people (``None``: nothing to say).

        >>> PaceView(12.34).text(0.0)
        'pace lowered to 12.3/s after 429 answers'
        >>> PaceView(None, 90.0).text(0.0)
        'paused until 1970-01-01 00:01:30 UTC (its receiver asked, Retry-After)'
        """
        if self.paused_until > now:
            until = datetime.datetime.fromtimestamp(self.paused_until, datetime.UTC)
            return f"paused until {until:%Y-%m-%d %H:%M:%S} UTC (its receiver asked, Retry-After)"
        if self.pace is not None:
            return f"pace lowered to {self.pace:.1f}/s after 429 answers"
        return None


class _Due:
    """Parkings (when each is due, how many records, where), a heap, and the records not due."""

    __slots__ = ("heap", "count")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, object]] = []
        self.count = 0

    def push(self, due: float, records: int, place: object) -> None:
        heapq.heappush(self.heap, (due, records, place))
        self.count += records

    def left(self, now: float) -> int:
        """The records not due by ``now`` (those due are forgotten)."""
        heap = self.heap
        while heap and heap[0][0] <= now:
            self.count -= heapq.heappop(heap)[1]
        return self.count

    def drop(self, places: set[object]) -> None:
        """Forget the parkings in ``places``."""
        if self.heap:
            self.heap = [due for due in self.heap if due[2] not in places]
            heapq.heapify(self.heap)
            self.count = sum(due[1] for due in self.heap)


@dataclass(slots=True)
class _Own:
    """This member's counts and decisions for one destination."""

    taken: int = 0
    waited: int = 0
    #: Records parked for their turn: when each parking is due back (monotonic), how many,
    #: and where (an opaque place: a partition).
    out: list[tuple[float, int, object]] = field(default_factory=list)
    #: How many of them were still out when this interval began.
    carried: int = 0
    #: Parkings by choice (``queued``) by when each is due (no allowance; heaps), and their
    #: records: those back within ``HEAD_WAIT`` (the queue's head), and the others.
    head: _Due = field(default_factory=_Due)
    rest: _Due = field(default_factory=_Due)
    accepted: int = 0
    #: When each 2xx answer of the last ``ACCEPTED_MEMORY`` came (monotonic seconds).
    recent: deque[float] = field(default_factory=deque)
    #: A 429 came since the last ``STEP_EVERY``'s step (it steps nothing up).
    throttled: bool = False
    #: A 429 came since the last tick (which lowers the pace, at most once a step).
    refused: bool = False
    pace: float | None = None
    step: float = 0.0
    lowered_to: float = 0.0
    last_decrease: float = float("-inf")
    paused_until: float = 0.0
    #: Since when it has asked without a break (monotonic seconds).
    asked_since: float = 0.0
    #: The last interval's figures, as published.
    report: Report = field(default_factory=Report)


def _recent(own: _Own, now: float) -> deque[float]:
    """``own``'s 2xx answer times, those older than ``ACCEPTED_MEMORY`` forgotten."""
    recent = own.recent
    while recent and recent[0] < now - ACCEPTED_MEMORY:
        recent.popleft()
    return recent


@dataclass(slots=True)
class _Heard:
    report: Report
    heard_at: float


class PaceBook:
    """What this member knows of every destination's pace: its own counts, and every member's
    last report. ``wall``: epoch seconds (pauses, report times); ``clock``: monotonic seconds
    (liveness, intervals). Used from one thread, except ``take``, which the topic's follower
    calls: its writes are single dict assignments."""

    def __init__(
        self,
        member: str,
        *,
        wall: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.member = member
        self._wall = wall
        self._clock = clock
        self._own: dict[str, _Own] = {}
        self._heard: dict[str, dict[str, _Heard]] = {}
        # Asked for every record, kept as reports come (written only by ``take``'s thread): the
        # latest pause any member ever reported, and the destinations some member lowered.
        self._heard_paused: dict[str, float] = {}
        self._heard_lowered: set[str] = set()
        self._changes: list[PaceChange] = []
        self._moved: deque[frozenset[object]] = deque()  # appended on a consumer's thread
        self._interval_started = self._last_step = clock()

    def _of(self, destination: str) -> _Own:
        own = self._own.get(destination)
        if own is None:
            own = self._own[destination] = _Own()
        return own

    # ---- what the sender tells ---------------------------------------------------------------

    def taken(self, destination: str) -> None:
        """A request to ``destination`` took its turn."""
        self._of(destination).taken += 1

    def waited(
        self, destination: str, records: int = 1, back_in: float = 0.0, place: object = None
    ) -> None:
        """``records`` of ``destination`` had to wait for their turn: held, or parked in
        ``place`` to come back in ``back_in`` seconds. Parked ones count in the demand of every
        interval they are out in: waves of parked records come back about once an interval, and
        an interval between two waves must not read as a demand that ended (the share would
        fall to the fallback, or to nothing, while a backlog waits)."""
        own = self._of(destination)
        own.waited += records
        if back_in > 0:
            own.out.append((self._clock() + back_in + RETURN_ALLOWANCE, records, place))
            self.queued(destination, records, back_in, place)

    def queued(self, destination: str, records: int, back_in: float, place: object = None) -> None:
        """``records`` of ``destination`` were parked by choice (for their turn, or for a free
        slot under ``max_in_flight``) in ``place``, to come back in ``back_in`` seconds."""
        own = self._of(destination)
        (own.head if back_in <= HEAD_WAIT else own.rest).push(
            self._clock() + back_in, records, place
        )

    def parked(self, destination: str) -> tuple[int, int]:
        """Records of ``destination`` this member parked by choice (``queued``; ``waited`` with
        a ``back_in``) that are not due back yet, but for those whose place moved: at the head
        of its queue (back within ``HEAD_WAIT`` when parked), and in all."""
        own = self._own.get(destination)
        if own is None:
            return 0, 0
        now = self._clock()
        head = own.head.left(now)
        return head, head + own.rest.left(now)

    def moved(self, places: Iterable[object]) -> None:
        """``places`` went to another member (a rebalance): what was parked there comes back
        there, and is no longer this member's demand. Any thread."""
        self._moved.append(frozenset(places))

    def answered(self, destination: str, status: int | None, retry_after: float | None) -> None:
        """A webhook of ``destination`` answered ``status`` (``retry_after``: the seconds its
        ``Retry-After`` asked for, on a 429 or 503)."""
        if status is None:
            return
        own = self._of(destination)
        if 200 <= status < 300:
            own.accepted += 1
            now, recent = self._clock(), own.recent
            recent.append(now)
            while recent[0] < now - ACCEPTED_MEMORY:
                recent.popleft()
        elif status in (429, 503) and retry_after is not None:
            until = self._wall() + min(max(retry_after, 0.0), RETRY_AFTER_MAX)
            if until > self.paused_until(destination) + 0.5:
                self._changes.append(PaceChange(destination, "paused", until=until, status=status))
            own.paused_until = max(own.paused_until, until)
        elif status == 429:
            own.throttled = own.refused = True  # the interval's end lowers the pace (``tick``)

    def _decrease(self, destination: str, own: _Own, now: float) -> None:
        accepted = self._accepted_rate(destination, own, now)
        current = self.pace(destination)
        base = accepted if accepted > 0 else (current or own.report.demand or MIN_PACE) / 2
        if current is not None:
            base = min(base, current)
        own.pace = max(MIN_PACE, base * DECREASE)
        own.lowered_to = own.pace
        own.step = max(MIN_PACE / 10, own.pace * STEP)
        own.last_decrease = now
        self._changes.append(PaceChange(destination, "slowed", pace=own.pace))

    def accepting(self, destination: str) -> float:
        """The 2xx answers of ``destination`` a second here, over the last ``ACCEPTED_MEMORY``."""
        own = self._own.get(destination)
        return 0.0 if own is None else len(_recent(own, self._clock())) / ACCEPTED_MEMORY

    def _accepted_rate(self, destination: str, own: _Own, now: float) -> float:
        """The group's 2xx answers per second: this member's most in an ``ACCEPTED_WINDOW`` of
        the last ``ACCEPTED_MEMORY``, the others' as of their last reports."""
        times, most, first = list(_recent(own, now)), 0, 0
        for last, at in enumerate(times):
            while at - times[first] >= ACCEPTED_WINDOW:
                first += 1
            most = max(most, last - first + 1)
        mine = most / ACCEPTED_WINDOW
        return mine + sum(r.accepted for m, r in self._live(destination) if m != self.member)

    # ---- what the topic tells ----------------------------------------------------------------

    def take(self, key: bytes | None, value: bytes | None) -> None:
        """A record of the pace topic (any member's, this one's included: ignored)."""
        parts = split_key(key or b"")
        if parts is None or value is None:
            return
        destination, member = parts
        if member == self.member:
            return
        try:
            report = Report.decode(value)
        except ValueError:
            return
        self._heard.setdefault(destination, {})[member] = _Heard(report, self._clock())
        if report.paused_until > self._heard_paused.get(destination, 0.0):
            self._heard_paused[destination] = report.paused_until
        if report.pace is not None:
            self._heard_lowered.add(destination)

    def _live(self, destination: str) -> Iterable[tuple[str, Report]]:
        now, wall = self._clock(), self._wall()
        for member, heard in list(self._heard.get(destination, {}).items()):  # a copy, as above
            if now - heard.heard_at <= LIVE_FOR and wall - heard.report.at <= STALE_AFTER:
                yield member, heard.report

    # ---- what the sender asks ----------------------------------------------------------------

    def share(self, destination: str, fallback: float) -> float:
        """This member's share of ``destination``'s pace: its reported demand over every live
        member's (the same figures every member sees, so the shares add up to 1). A member that
        has not reported a demand yet gets nothing while others ask (it asks at its next
        report), and ``fallback`` when nobody asks."""
        own = self._own.get(destination)
        mine = 0.0 if own is None else own.report.demand
        others = [r.demand for m, r in self._live(destination) if m != self.member]
        if mine > 0:
            assert own is not None
            if not others and self._clock() - own.asked_since < 1.5 * INTERVAL:
                return fallback  # alone, or the others' first reports are on their way
            return mine / (mine + sum(others))
        return 0.0 if sum(others) > 0 else fallback

    def pace(self, destination: str) -> float | None:
        """The lowest live lowered pace of ``destination`` (requests per second for the whole
        group; ``None``: not lowered)."""
        own = self._own.get(destination)
        if destination not in self._heard_lowered:  # the common case: nobody lowered it
            return None if own is None else own.pace
        paces = [r.pace for _, r in self._live(destination) if r.pace is not None]
        if own is not None and own.pace is not None:
            paces.append(own.pace)
        return min(paces) if paces else None

    def paused_until(self, destination: str) -> float:
        """When ``destination``'s pause ends (epoch seconds; 0: none), by any member's word,
        live or not: a pause is a time, not a claim on the present."""
        own = self._own.get(destination)
        until = self._heard_paused.get(destination, 0.0)  # a member's pause only grows
        return until if own is None or own.paused_until < until else own.paused_until

    def paused_for(self, destination: str) -> float:
        """Seconds left of ``destination``'s pause (0: none)."""
        return max(0.0, self.paused_until(destination) - self._wall())

    # ---- every interval ----------------------------------------------------------------------

    def tick(self, limits: dict[str, float | None]) -> list[tuple[str, Report]]:
        """End an interval: the reports to publish (destinations with something to say), each
        lowered pace adopted from the group and stepped up, and the counts started again.
        ``limits``: each destination's ``rate_limit`` (a pace reaching it is lifted)."""
        now, wall = self._clock(), self._wall()
        elapsed = max(now - self._interval_started, 1e-3)
        self._interval_started = now
        # A tick made early (a change to publish at once) steps nothing up.
        stepping = now - self._last_step >= STEP_EVERY * 0.9
        if stepping:
            self._last_step = now
        moved: set[object] = set()
        while self._moved:
            moved |= self._moved.popleft()
        reports = []
        for destination, own in list(self._own.items()):
            if own.refused:  # at most once a step: a decrease's effect takes a step to show
                own.refused = False
                if now - own.last_decrease >= STEP_EVERY * 0.9:
                    self._decrease(destination, own, now)
            group = self.pace(destination)
            if group is not None and (own.pace is None or group < own.pace):
                own.pace = own.lowered_to = group  # adopted: step up from the group's
                own.step = max(MIN_PACE / 10, group * STEP)
            elif own.pace is not None and not own.throttled and stepping:
                self._step_up(destination, own, limits.get(destination))
            own.out = [out for out in own.out if out[0] > now and out[2] not in moved]
            if moved:
                own.head.drop(moved)
                own.rest.drop(moved)
            carried, own.carried = own.carried, sum(out[1] for out in own.out)
            report = Report(
                demand=(own.taken + own.waited + carried) / elapsed,
                accepted=own.accepted / elapsed,
                pace=own.pace,
                paused_until=own.paused_until if own.paused_until > wall else 0.0,
                at=wall,
            )
            if report.demand and not own.report.demand:
                own.asked_since = now
            # A demand that ended is said once (0), so that the others take its share at once.
            said = own.report.demand or report.demand or report.pace is not None
            own.report = report
            own.taken = own.waited = own.accepted = 0
            if stepping:
                own.throttled = False
            if said or report.paused_until:
                reports.append((destination, report))
            elif destination not in limits:
                del self._own[destination]  # gone from the config, and nothing to say
        return reports

    def farewell(self) -> list[tuple[str, Report]]:
        """The reports of a member that stops: it asks for nothing any more, so the others take
        its share at once rather than when its last report ages out (``LIVE_FOR``); its pause
        and lowered pace stay as they were.

        >>> book = PaceBook("a", wall=lambda: 100.0)
        >>> book.taken("hooks"); _ = book.tick({"hooks": 40.0})
        >>> [(d, r.demand, r.at) for d, r in book.farewell()]
        [('hooks', 0.0, 100.0)]
        """
        wall = self._wall()
        return [
            (destination, replace(own.report, demand=0.0, accepted=0.0, at=wall))
            for destination, own in self._own.items()
            if own.report.demand
        ]

    def _step_up(self, destination: str, own: _Own, limit: float | None) -> None:
        assert own.pace is not None
        own.pace += own.step
        if limit is not None:
            lifted = own.pace >= limit
        else:
            # Lifted while a backlog waits, the whole of it would go at once, to be refused
            # but for what the receiver takes: step on up until a 429 or until it holds
            # nothing back.
            demand = own.report.demand + sum(r.demand for m, r in self._live(destination))
            lifted = own.pace >= 2 * own.lowered_to and demand < own.pace
        if lifted:
            own.pace = None
            self._changes.append(PaceChange(destination, "restored", pace=limit))

    def pending(self) -> bool:
        """Is there a change to publish at once (a pause, a lowered pace)?"""
        return bool(self._changes)

    def view(self, destination: str) -> PaceView:
        return PaceView(self.pace(destination), self.paused_until(destination))

    def changes(self) -> list[PaceChange]:
        """What this member decided since the last call (for the operational events)."""
        changes, self._changes = self._changes, []
        return changes

    def destinations(self) -> set[str]:
        """Every destination it counts for, or has heard a report of."""
        return {*self._own, *list(self._heard)}  # a copy of the keys: ``take``'s thread
