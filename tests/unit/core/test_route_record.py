"""``pipeline.core.routing.route_record``: the router's whole decision for one record."""

from __future__ import annotations

import pytest

from pipeline import Call, parse_call
from pipeline.core.config import ConfigTable, Destination, Source
from pipeline.core.exceptions import UndecodableRecord
from pipeline.core.records import Delivery
from pipeline.core.render import render_body
from pipeline.core.routing import DropReason, Routed, route_record

TABLE = ConfigTable.build(
    [Source(id="web", write_keys=["wk"], blocked_events=["Heartbeat"])],
    [
        Destination(id=d, sources=["web"], webhooks=[{"url": f"https://x/{d}"}])  # type: ignore[list-item]
        for d in ("hooks-b", "hooks-a")
    ],
)


def decoding(call: Call):  # type: ignore[no-untyped-def]
    return lambda data: call


def failing(exc: Exception):  # type: ignore[no-untyped-def]
    def decode(data: bytes | None) -> Call:
        raise exc

    return decode


def test_one_delivery_per_destination_keyed_destination_slash_user() -> None:
    call = parse_call(
        {"type": "track", "event": "Order", "userId": "u1"}, source_id="web", received_at=7
    )
    routed = route_record(b"ignored", decoding(call), TABLE)
    body = render_body(call)
    assert routed == Routed(
        call.type,
        Delivery(call.message_id, "hooks-a", "web", "track", body, 7, user_id="u1"),
        ((b"hooks-a/u1", "hooks-a"), (b"hooks-b/u1", "hooks-b")),
        call=call,
    )
    assert routed.deliveries == (
        (
            b"hooks-a/u1",
            Delivery(call.message_id, "hooks-a", "web", "track", body, 7, user_id="u1"),
        ),
        (
            b"hooks-b/u1",
            Delivery(call.message_id, "hooks-b", "web", "track", body, 7, user_id="u1"),
        ),
    )
    [(_, fresh), _] = routed.deliveries
    assert (fresh.tier, fresh.not_before, fresh.first_attempt_at, fresh.attempts) == (
        -1,
        0,
        None,
        (),
    )


def test_the_key_falls_back_to_the_anonymous_id() -> None:
    call = parse_call({"type": "page", "anonymousId": "anon"}, source_id="web", received_at=0)
    keys = [key for key, _ in route_record(None, decoding(call), TABLE).deliveries]
    assert keys == [b"hooks-a/anon", b"hooks-b/anon"]


@pytest.mark.parametrize(
    ("raw", "reason", "excluded"),
    [
        ({"type": "track", "event": "Heartbeat", "userId": "u"}, DropReason.BLOCKED_EVENT, ()),
        (
            {"type": "track", "event": "x", "userId": "u", "integrations": {"All": False}},
            DropReason.NO_DESTINATION,
            (("hooks-a", DropReason.INTEGRATIONS), ("hooks-b", DropReason.INTEGRATIONS)),
        ),
    ],
)
def test_dropped_with_its_reason_and_still_counted_by_type(
    raw: dict[str, object], reason: DropReason, excluded: tuple[tuple[str, DropReason], ...]
) -> None:
    call = parse_call(raw, source_id="web", received_at=0)
    assert route_record(None, decoding(call), TABLE) == Routed(
        call.type, dropped=reason, call=call, excluded=excluded
    )


def test_unknown_source_is_dropped() -> None:
    call = parse_call({"type": "identify", "userId": "u"}, source_id="gone", received_at=0)
    assert route_record(None, decoding(call), TABLE).dropped is DropReason.UNKNOWN_SOURCE


@pytest.mark.parametrize(
    "exc",
    [
        UndecodableRecord("no C3 01 header"),
        KeyError("messageId"),
        ValueError("'bogus' is not a CallType"),
    ],
)
def test_undecodable_goes_to_the_dead_letter_topic_with_why(exc: Exception) -> None:
    routed = route_record(b"junk", failing(exc), TABLE)
    assert routed == Routed(undecodable=str(exc))


def test_other_errors_are_not_the_records_fault_and_propagate() -> None:
    with pytest.raises(RuntimeError):
        route_record(b"x", failing(RuntimeError("registry down")), TABLE)
