"""A destination's pace across processes (``pipeline.core.pace``): shares, pauses, AIMD."""

from __future__ import annotations

import pytest

from pipeline.core.config import Destination
from pipeline.core.endpoint_health import EndpointHealth
from pipeline.core.outcomes import Failure, UrlResult
from pipeline.core.pace import (
    DECREASE,
    INTERVAL,
    LIVE_FOR,
    MIN_PACE,
    RETRY_AFTER_MAX,
    STEP,
    STEP_EVERY,
    PaceBook,
    Report,
    report_key,
)
from pipeline.core.settings import Settings

WALL = 1_800_000_000.0
#: The tests tick a second apart: a tick may come at any time (a report says what happened per
#: second since the last), and a lowered pace steps up once a second whatever the interval.
SECOND = 1.0


class Clocks:
    """A wall clock and a monotonic clock a test moves together."""

    def __init__(self) -> None:
        self.now = 0.0

    def wall(self) -> float:
        return WALL + self.now

    def mono(self) -> float:
        return self.now


def book(member: str = "a") -> tuple[PaceBook, Clocks]:
    clocks = Clocks()
    return PaceBook(member, wall=clocks.wall, clock=clocks.mono), clocks


def hear(to: PaceBook, clocks: Clocks, member: str, **fields: float | None) -> None:
    to.take(report_key("hooks", member), Report(at=clocks.wall(), **fields).encode())  # type: ignore[arg-type]


def ask(pace: PaceBook, clocks: Clocks, taken: int, waited: int = 0) -> None:
    """One interval in which this member took ``taken`` turns and had ``waited`` records wait."""
    for _ in range(taken):
        pace.taken("hooks")
    pace.waited("hooks", waited)
    clocks.now += SECOND
    pace.tick({"hooks": 40.0})


# ---- shares --------------------------------------------------------------------------------------


def test_with_nobody_asking_a_member_sends_its_partitions_share() -> None:
    pace, _ = book()
    assert pace.share("hooks", fallback=0.4) == 0.4


def test_the_shares_follow_what_each_member_asks_and_add_up_to_one() -> None:
    a, clocks = book("a")
    b = PaceBook("b", wall=clocks.wall, clock=clocks.mono)
    for _ in range(3):  # a asks 30/s, b 10/s; each hears the other
        for member, (taken, waited) in ((a, (20, 10)), (b, (5, 5))):
            for _ in range(taken):
                member.taken("hooks")
            member.waited("hooks", waited)
        clocks.now += SECOND
        for member in (a, b):
            [(_, report)] = member.tick({"hooks": 40.0})
            (b if member is a else a).take(report_key("hooks", member.member), report.encode())
    assert a.share("hooks", 0.5) == pytest.approx(0.75)
    assert b.share("hooks", 0.5) == pytest.approx(0.25)


def test_a_member_that_has_not_asked_yet_gets_nothing_while_others_ask() -> None:
    pace, clocks = book()
    hear(pace, clocks, "b", demand=30.0)
    assert pace.share("hooks", fallback=0.5) == 0.0  # it asks at its next report


def test_a_member_alone_gets_all_once_the_others_first_reports_had_time_to_come() -> None:
    pace, clocks = book()
    ask(pace, clocks, 10)
    assert pace.share("hooks", fallback=0.5) == 0.5  # the others may be starting too
    ask(pace, clocks, 10)
    clocks.now += 0.6  # 1.5 intervals since its first report: nobody else asks
    assert pace.share("hooks", fallback=0.5) == 1.0


def test_a_demand_that_ended_is_said_once_so_the_others_take_its_share() -> None:
    pace, clocks = book()
    ask(pace, clocks, 10)
    clocks.now += SECOND
    [(destination, report)] = pace.tick({"hooks": 40.0})
    assert (destination, report.demand) == ("hooks", 0.0)
    clocks.now += SECOND
    assert pace.tick({"hooks": 40.0}) == []  # then nothing more to say


def test_a_member_that_stops_says_so_and_the_others_take_its_share_at_once() -> None:
    """Its farewell asks for nothing, keeping its pause; without it, the others would send
    their part of the limit until its last report aged out (``LIVE_FOR``)."""
    leaving, clocks = book("b")
    pace = PaceBook("a", wall=clocks.wall, clock=clocks.mono)
    leaving.taken("hooks")
    leaving.answered("hooks", 429, retry_after=60.0)
    ask(pace, clocks, 1)  # both asked for one turn a second
    [(_, report)] = leaving.tick({"hooks": 40.0})
    pace.take(report_key("hooks", "b"), report.encode())
    assert pace.share("hooks", fallback=0.5) == pytest.approx(0.5)
    [(destination, farewell)] = leaving.farewell()
    assert (destination, farewell.demand, farewell.paused_until) == (
        "hooks",
        0.0,
        report.paused_until,
    )
    assert farewell.paused_until > clocks.wall()
    pace.take(report_key("hooks", "b"), farewell.encode())
    assert pace.share("hooks", fallback=0.5) == 1.0
    assert PaceBook("c").farewell() == []  # nothing asked, nothing to say


def test_records_parked_for_their_turn_ask_in_every_interval_they_are_out() -> None:
    """A wave of parked records comes back about once a second: the interval between two
    waves still asks for them, and a rebalance that moves their partition ends that."""
    pace, clocks = book()
    pace.waited("hooks", 30, back_in=1.0, place=("retry.0", 1))
    clocks.now += SECOND
    [(_, first)] = pace.tick({"hooks": 40.0})
    clocks.now += SECOND  # none came back in this interval: still out, still asked for
    [(_, between)] = pace.tick({"hooks": 40.0})
    assert first.demand == between.demand == 30.0
    clocks.now += SECOND  # back (due at 1.0, with 0.5 s to come back): nothing asks
    [(_, after)] = pace.tick({"hooks": 40.0})
    assert after.demand == 0.0
    pace.waited("hooks", 30, back_in=1.0, place=("retry.0", 1))
    pace.moved([("retry.0", 1)])  # another member reads them back now
    clocks.now += SECOND
    pace.tick({"hooks": 40.0})
    clocks.now += SECOND
    [(_, moved)] = pace.tick({"hooks": 40.0})
    assert moved.demand == 0.0


def test_a_member_not_heard_for_a_while_has_left() -> None:
    pace, clocks = book()
    ask(pace, clocks, 10)
    ask(pace, clocks, 10)
    hear(pace, clocks, "b", demand=30.0)
    assert pace.share("hooks", 0.5) == pytest.approx(0.25)
    clocks.now += LIVE_FOR + 0.1
    assert pace.share("hooks", 0.5) == 1.0


def test_a_report_that_is_not_one_is_ignored() -> None:
    pace, clocks = book()
    pace.take(report_key("hooks", "b"), b"{not json")
    pace.take(b"no-separator", Report(demand=5.0, at=clocks.wall()).encode())
    assert pace.share("hooks", 0.5) == 0.5
    assert Report.decode(Report(1.0, 2.0, 3.0, 4.0, 5.0).encode()) == Report(
        1.0, 2.0, 3.0, 4.0, 5.0
    )
    with pytest.raises(ValueError, match="not a pace report"):
        Report.decode(b'{"demand": 1}')


# ---- pauses --------------------------------------------------------------------------------------


def test_retry_after_pauses_the_destination_and_tells_the_others() -> None:
    pace, clocks = book()
    pace.answered("hooks", 429, 30.0)
    assert pace.paused_for("hooks") == pytest.approx(30.0)
    [change] = pace.changes()
    assert (change.kind, change.status, change.until) == ("paused", 429, WALL + 30.0)
    clocks.now += SECOND
    [(_, report)] = pace.tick({"hooks": None})
    assert report.paused_until == WALL + 30.0
    other = PaceBook("b", wall=clocks.wall, clock=clocks.mono)
    other.take(report_key("hooks", "a"), report.encode())
    assert other.paused_for("hooks") == pytest.approx(29.0)


def test_a_pause_outlives_the_member_that_asked_for_it() -> None:
    pace, clocks = book()
    hear(pace, clocks, "b", paused_until=WALL + 60.0)
    clocks.now += LIVE_FOR * 4  # b is gone; its pause is a time, and still holds
    assert pace.paused_for("hooks") == pytest.approx(60.0 - LIVE_FOR * 4)


def test_the_longest_pause_heard_holds_until_it_ends() -> None:
    pace, clocks = book()
    hear(pace, clocks, "b", paused_until=WALL + 10.0)
    hear(pace, clocks, "c", paused_until=WALL + 5.0)  # a shorter one does not shorten it
    assert pace.paused_for("hooks") == pytest.approx(10.0)
    assert pace.paused_until("hooks") == WALL + 10.0
    clocks.now += 11.0
    hear(pace, clocks, "b", paused_until=0.0)  # its pause ended: its reports say none
    assert pace.paused_for("hooks") == 0.0
    pace.answered("hooks", 429, 20.0)  # a new pause here counts, beside the heard ones
    assert pace.paused_for("hooks") == pytest.approx(20.0)


def test_a_pause_is_never_longer_than_an_hour_and_503_pauses_too() -> None:
    pace, _ = book()
    pace.answered("hooks", 503, 86_400.0)
    assert pace.paused_for("hooks") == RETRY_AFTER_MAX


# ---- a lowered pace ------------------------------------------------------------------------------


def test_429_without_retry_after_lowers_the_pace_below_what_was_accepted() -> None:
    pace, clocks = book()
    for _ in range(100):
        pace.answered("hooks", 200, None)
    clocks.now += INTERVAL
    pace.answered("hooks", 429, None)
    assert pace.pace("hooks") is None  # the end of the interval decides, all answers in
    pace.tick({"hooks": None})  # 100 accepted in the last second
    assert pace.pace("hooks") == pytest.approx(100 * DECREASE)
    [change] = pace.changes()
    assert change.kind == "slowed" and change.pace == pytest.approx(100 * DECREASE)
    clocks.now += INTERVAL
    pace.answered("hooks", 429, None)
    pace.tick({"hooks": None})  # at most once a second
    assert pace.pace("hooks") == pytest.approx(100 * DECREASE)
    assert pace.changes() == []


def test_what_was_accepted_is_the_most_in_a_second_lately_however_the_intervals_fall() -> None:
    """A burst's 2xx answers, then an interval stretched by a busy loop: what the receiver took
    in a second is what lowers the pace, not the answers over the interval's length; and a wave
    of retried records, then its tail: the wave's second, not the tail's."""
    pace, clocks = book()
    pace.tick({"hooks": None})
    clocks.now += 0.1
    for _ in range(20):
        pace.answered("hooks", 200, None)
    clocks.now += 0.8  # the tick comes late
    pace.answered("hooks", 429, None)
    pace.tick({"hooks": None})
    assert pace.pace("hooks") == pytest.approx(20 * DECREASE)
    clocks.now += 4.0  # the burst is forgotten
    for _ in range(15):  # a wave
        pace.answered("hooks", 200, None)
    clocks.now += 0.9
    for _ in range(2):  # its tail
        pace.answered("hooks", 200, None)
    clocks.now += 0.6
    pace.answered("hooks", 429, None)
    pace.tick({"hooks": None})  # the last second holds 2; the wave's, 17
    assert pace.pace("hooks") == pytest.approx(17 * DECREASE)


def lowered_by_a_429(pace: PaceBook, clocks: Clocks, limit: float) -> float:
    """A second of 20 accepted answers, then a 429: the pace it lowered to."""
    for _ in range(20):
        pace.answered("hooks", 200, None)
    clocks.now += INTERVAL
    pace.answered("hooks", 429, None)
    pace.tick({"hooks": limit})
    lowered = pace.pace("hooks")
    assert lowered is not None and lowered == pytest.approx(20 * DECREASE)
    return lowered


def test_a_lowered_pace_steps_back_up_to_the_limit_and_is_lifted() -> None:
    pace, clocks = book()
    lowered = lowered_by_a_429(pace, clocks, 20.0)
    pace.changes()
    clocks.now += SECOND
    pace.tick({"hooks": 20.0})  # the interval of the 429 does not step up
    assert pace.pace("hooks") == pytest.approx(lowered)
    clocks.now += SECOND
    pace.tick({"hooks": 20.0})
    assert pace.pace("hooks") == pytest.approx(lowered * (1 + STEP))  # a fixed step
    for _ in range(10):
        clocks.now += SECOND
        pace.tick({"hooks": 20.0})
    assert pace.pace("hooks") is None
    assert [c.kind for c in pace.changes()] == ["restored"]


def test_a_lowered_pace_steps_up_once_a_second_however_often_reports_go() -> None:
    """Reports go every ``INTERVAL`` (half a second); AIMD's step stays ``STEP_EVERY``."""
    assert INTERVAL < STEP_EVERY
    pace, clocks = book()
    lowered = lowered_by_a_429(pace, clocks, 40.0)
    ticks = round(4 * STEP_EVERY / INTERVAL)  # four seconds of reports
    for _ in range(ticks):
        clocks.now += INTERVAL
        pace.tick({"hooks": 40.0})
    # The first second holds the 429 (no step); then a step a second, not a step a report.
    assert pace.pace("hooks") == pytest.approx(lowered * (1 + 3 * STEP))


def unlimited_lowered_to_the_floor(pace: PaceBook, clocks: Clocks) -> None:
    clocks.now += SECOND
    pace.answered("hooks", 429, None)  # nothing accepted yet: the floor
    pace.tick({"hooks": None})
    assert pace.pace("hooks") == MIN_PACE


def test_an_unlimited_destinations_pace_is_lifted_at_twice_where_it_was_lowered() -> None:
    pace, clocks = book()
    unlimited_lowered_to_the_floor(pace, clocks)
    steps = 0
    while pace.pace("hooks") is not None and steps < 100:
        clocks.now += SECOND
        pace.tick({"hooks": None})
        steps += 1
    assert 10 <= steps <= 30


def test_an_unlimited_destinations_pace_steps_on_up_while_a_backlog_waits_for_it() -> None:
    """Lifted while records wait for their turns, the whole backlog would go at once and be
    refused but for what the receiver takes: the pace goes on up until nothing waits."""
    pace, clocks = book()
    unlimited_lowered_to_the_floor(pace, clocks)
    for _ in range(40):  # a backlog: 100 records wait each second
        pace.taken("hooks")
        pace.waited("hooks", 100)
        clocks.now += SECOND
        pace.tick({"hooks": None})
    lowered = pace.pace("hooks")
    assert lowered is not None and lowered > 2 * MIN_PACE  # past twice, still stepping
    assert lowered == pytest.approx(5 * MIN_PACE)  # 40 steps of a tenth of the floor
    clocks.now += SECOND
    pace.tick({"hooks": None})  # the backlog is gone: the last interval asked for 2/s
    clocks.now += SECOND
    pace.tick({"hooks": None})  # nothing asked
    assert pace.pace("hooks") is None
    assert [c.kind for c in pace.changes()] == ["slowed", "restored"]


def test_members_adopt_the_lowest_live_pace() -> None:
    pace, clocks = book()
    ask(pace, clocks, 5)
    hear(pace, clocks, "b", demand=5.0, pace=12.0)
    assert pace.pace("hooks") == 12.0
    clocks.now += SECOND
    pace.tick({"hooks": 40.0})
    clocks.now += LIVE_FOR + 0.1  # b is gone; a goes on from the pace it adopted
    assert pace.pace("hooks") == pytest.approx(12.0)


def test_a_lowered_pace_heard_counts_only_while_its_member_is_live() -> None:
    pace, clocks = book()
    assert pace.pace("hooks") is None
    hear(pace, clocks, "b", demand=5.0, pace=12.0)
    assert pace.pace("hooks") == 12.0
    clocks.now += LIVE_FOR + 0.1  # b is gone, and this member never adopted its pace
    assert pace.pace("hooks") is None


def test_the_records_parked_by_choice_count_until_due_or_moved() -> None:
    pace, clocks = book()
    assert pace.parked("hooks") == (0, 0)
    pace.waited("hooks", 100, back_in=0.5, place=("t0", 0))  # the queue's head
    pace.waited("hooks", 300, back_in=40.0, place=("t1", 0))
    pace.waited("hooks", 7, back_in=40.0, place=("t1", 1))
    pace.queued("hooks", 20, back_in=1.0)  # for a free slot, by key
    pace.waited("hooks", 5)  # held in flight: not parked
    assert pace.parked("hooks") == (120, 427)
    clocks.now += 0.5  # the first parking is due back
    assert pace.parked("hooks") == (20, 327)
    pace.moved([("t1", 1)])  # a rebalance: those come back elsewhere
    pace.tick({"hooks": 40.0})
    assert pace.parked("hooks") == (20, 320)
    clocks.now += 40.0
    assert pace.parked("hooks") == (0, 0)


# ---- what the sender sees ------------------------------------------------------------------------


HOOKS = Destination.model_validate(
    {"id": "hooks", "sources": ["s"], "webhooks": [{"url": "https://a.example/"}], "rate_limit": 40}
)


def test_the_bucket_follows_the_lowered_pace_and_the_share() -> None:
    clocks = Clocks()
    pace = PaceBook("a", wall=clocks.wall, clock=clocks.mono)
    health = EndpointHealth(Settings(), clock=clocks.mono, pace=pace)
    health.set_share("deliver", 1.0)
    health.set_share("retry", 1.0)
    assert health.rate_of(HOOKS) == 40.0
    health.answered(HOOKS, [UrlResult("https://a.example/", 429, Failure.RATE_LIMITED)])
    pace.tick({"hooks": 40.0})
    assert health.group_rate(HOOKS) == MIN_PACE and health.rate_of(HOOKS) == MIN_PACE
    health.answered(
        HOOKS, [UrlResult("https://a.example/", 503, Failure.SERVER_ERROR, retry_after=20.0)]
    )
    assert health.snapshot(HOOKS).paused_for == pytest.approx(20.0)


def test_the_queue_parked_here_is_in_seconds_of_the_groups_pace() -> None:
    """Not of this process's share of it, which swings (to 1 % before the others' reports)."""
    clocks = Clocks()
    pace = PaceBook("a", wall=clocks.wall, clock=clocks.mono)
    health = EndpointHealth(Settings(), clock=clocks.mono, pace=pace)
    health.set_share("deliver", 0.0)
    health.set_share("retry", 0.0)  # no partitions yet: 1 % of 40/s here
    pace.waited("hooks", 400, back_in=30.0, place=("t0", 0))
    assert health.rate_of(HOOKS) == pytest.approx(0.4)
    pace.waited("hooks", 40, back_in=0.5, place=("t0", 0))
    snapshot = health.snapshot(HOOKS)
    assert (snapshot.queue, snapshot.behind) == pytest.approx((1.0, 11.0))  # at 40/s
    # Unlimited (at its max_in_flight): at the pace its receiver accepted lately, if known.
    unlimited = HOOKS.model_copy(update={"rate_limit": None})
    assert health.queue(unlimited) == (0.0, 0.0)
    for _ in range(30):
        pace.answered("hooks", 200, None)
    assert pace.accepting("hooks") == pytest.approx(10.0)  # 30 in the last 3 s
    assert health.snapshot(unlimited).accepting == pytest.approx(10.0)
    pace.queued("hooks", 60, back_in=30.0)
    assert health.queue(unlimited) == pytest.approx((4.0, 50.0))  # 40 and 500 at 10/s
