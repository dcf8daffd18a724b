"""Replaying retained calls to one destination (``pipeline.core.call_replay``)."""

from __future__ import annotations

import pytest

from pipeline.core.call_replay import (
    DEFAULT_RATE,
    ReplaySelection,
    Skipped,
    default_rate,
    replay_delivery,
)
from pipeline.core.calls import Call, CallType, parse_call
from pipeline.core.config import ConfigTable, Destination, Source
from pipeline.core.exceptions import InvalidCall
from pipeline.core.records import (
    RangeReplay,
    ReplayPosition,
    range_replay_from_record,
    range_replay_to_record,
)
from pipeline.core.render import render_body
from pipeline.core.routing import route_record

URL = "https://a.example/h"
TABLE = ConfigTable.build(
    [
        Source(id="web", write_keys=["wk"], blocked_events=["Debug"]),
        Source(id="app", write_keys=["wk2"]),
    ],
    [
        Destination(id="new", name="Backfill", sources=["web"], webhooks=[{"url": URL}]),  # type: ignore[list-item]
        Destination(id="live", sources=["web", "app"], webhooks=[{"url": URL}]),  # type: ignore[list-item]
        Destination(id="off", sources=["web"], enabled=False, webhooks=[{"url": URL}]),  # type: ignore[list-item]
        Destination(id="capped", sources=["web"], rate_limit=50, webhooks=[{"url": URL}]),  # type: ignore[list-item]
    ],
)
SELECTION = ReplaySelection("new", since=100, until=200, since_text="2h")


def call(received_at: int = 150, source: str = "web", **fields: object) -> Call:
    raw = {"type": "track", "event": "Order", "userId": "u1", **fields}
    return parse_call(raw, source_id=source, received_at=received_at)


def test_the_range_includes_both_ends_and_filters_narrow_it() -> None:
    assert [SELECTION.matches(call(t)) for t in (99, 100, 200, 201)] == [False, True, True, False]
    only = ReplaySelection("new", 100, 200, "2h", source="web", call_type=CallType.TRACK, user="u1")
    assert only.matches(call())
    assert not only.matches(call(source="app"))
    assert not only.matches(call(userId="u2"))
    assert not only.matches(
        parse_call({"type": "identify", "userId": "u1"}, source_id="web", received_at=150)
    )


def test_a_call_is_rendered_and_keyed_exactly_as_the_router_does_it() -> None:
    c = call()
    key, delivery = replay_delivery(c, TABLE, "new")  # type: ignore[misc]
    routed = dict(
        (d.destination_id, (k, d)) for k, d in route_record(b"", lambda _: c, TABLE).deliveries
    )
    live_key, live = routed["new"]
    assert key == live_key == b"new/u1"
    assert delivery.body == live.body == render_body(c)
    assert delivery == live._replace(replays=1)  # marked: not counted as end-to-end latency
    assert delivery.message_id == c.message_id and delivery.user_id == "u1"


def test_what_live_routing_would_not_send_is_skipped_with_the_reason() -> None:
    assert replay_delivery(call(event="Debug"), TABLE, "new") is Skipped.BLOCKED_EVENT
    off = call(integrations={"Backfill": False})
    assert replay_delivery(off, TABLE, "new") is Skipped.INTEGRATIONS
    assert replay_delivery(call(source="app"), TABLE, "new") is Skipped.NOT_CONNECTED
    assert replay_delivery(call(source="gone"), TABLE, "new") is Skipped.NOT_CONNECTED
    delete = parse_call(
        {"type": "delete", "userId": "u1", "integrations": {"Backfill": False}},
        source_id="web",
        received_at=150,
    )
    assert not isinstance(replay_delivery(delete, TABLE, "new"), Skipped)  # as live: always


@pytest.mark.parametrize(
    ("selection", "flag", "text"),
    [
        (ReplaySelection("nope", 1, 2, "1h"), "--destination", "no destination has the id 'nope'"),
        (ReplaySelection("off", 1, 2, "1h"), "--destination", "'off' is disabled"),
        (
            ReplaySelection("new", 1, 2, "1h", source="app"),
            "--source",
            "source 'app' is not connected to destination 'new' (connected: web)",
        ),
        (ReplaySelection("new", 3, 2, "1h"), "--since", "is after --until"),
    ],
)
def test_a_selection_that_cannot_run_names_the_flag(
    selection: ReplaySelection, flag: str, text: str
) -> None:
    with pytest.raises(InvalidCall) as raised:
        selection.check(TABLE)
    assert raised.value.field == flag and text in str(raised.value)


def test_the_known_destinations_are_listed_for_an_unknown_one() -> None:
    with pytest.raises(InvalidCall, match="known: capped, live, new, off"):
        ReplaySelection("nope", 1, 2, "1h").check(TABLE)


def replay(**changes: object) -> RangeReplay:
    base = RangeReplay("r1", "new", None, None, None, 100, 200, "2h", "", 10.0, 1, 2)
    return base._replace(**changes)


def test_the_same_arguments_resume_and_overlapping_ranges_are_found() -> None:
    assert SELECTION.same_arguments(replay())
    assert not SELECTION.same_arguments(replay(since_text="3h"))
    assert not SELECTION.same_arguments(replay(call_type="track"))
    assert SELECTION.overlaps(replay(since=150, until=300))
    assert SELECTION.overlaps(replay(source_id="web", user_id="u1"))  # may hold some of them
    assert not SELECTION.overlaps(replay(since=201, until=300))
    assert not SELECTION.overlaps(replay(destination_id="live"))
    typed = ReplaySelection("new", 100, 200, "2h", call_type=CallType.TRACK)
    assert not typed.overlaps(replay(call_type="identify"))


def test_the_default_rate_is_half_the_destinations_limit_else_a_fixed_one() -> None:
    assert default_rate(TABLE.destinations["capped"]) == 25
    assert default_rate(TABLE.destinations["new"]) == DEFAULT_RATE


def test_a_replays_progress_round_trips_through_its_record() -> None:
    state = replay(finished_at=9, scanned=5, sent=4, positions=(ReplayPosition(0, 7, 9, True),))
    assert range_replay_from_record(range_replay_to_record(state)) == state
