"""Unit tests for pipeline.core.routing: which destinations a call goes to (seed §4.3 rules 6, 7)."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline import Call, parse_call
from pipeline.core.config import ConfigTable, Destination, Source
from pipeline.core.routing import DropReason, Route, delivery_key, key_destination, route


def dest(
    ident: str, *, name: str = "Webhooks", sources: tuple[str, ...] = ("web",), enabled: bool = True
) -> Destination:
    return Destination(
        id=ident,
        name=name,
        enabled=enabled,
        sources=list(sources),
        webhooks=[{"url": f"https://example.com/{ident}"}],  # type: ignore[list-item]
    )


TABLE = ConfigTable.build(
    [
        Source(id="web", write_keys=["wk-web"], blocked_events=["Debug Event", "Heartbeat"]),
        Source(id="ios", write_keys=["wk-ios"]),
        Source(id="lonely", write_keys=["wk-lonely"]),
    ],
    [
        dest("hooks-b", name="Webhooks"),
        dest("hooks-a", name="Hooks EU", sources=("web", "ios")),
        dest("hooks-off", name="Webhooks", sources=("web", "ios", "lonely"), enabled=False),
    ],
)


def call(raw: dict[str, Any], source_id: str = "web") -> Call:
    return parse_call(raw, source_id=source_id, received_at=0)


def ids(result: Route) -> list[str]:
    return [d.id for d in result.destinations]


def test_goes_to_every_enabled_destination_of_the_source() -> None:
    result = route(call({"type": "identify", "userId": "u"}), TABLE)
    assert result.dropped is None
    assert ids(result) == ["hooks-a", "hooks-b"]  # ordered by id; hooks-off is disabled
    assert ids(route(call({"type": "identify", "userId": "u"}, "ios"), TABLE)) == ["hooks-a"]


def test_unknown_source() -> None:
    assert route(call({"type": "identify", "userId": "u"}, "deleted"), TABLE) == Route(
        dropped=DropReason.UNKNOWN_SOURCE
    )


def test_no_destination_when_only_a_disabled_one_is_connected() -> None:
    result = route(call({"type": "track", "userId": "u", "event": "E"}, "lonely"), TABLE)
    assert result == Route(
        dropped=DropReason.NO_DESTINATION,
        excluded=(("hooks-off", DropReason.DESTINATION_DISABLED),),
    )


def test_blocked_track_event() -> None:
    for event in ("Debug Event", "Heartbeat"):
        result = route(call({"type": "track", "userId": "u", "event": event}), TABLE)
        assert result == Route(dropped=DropReason.BLOCKED_EVENT)


def test_blocking_is_exact_and_per_source() -> None:
    for event in ("debug event", "Debug Event ", "Debug"):
        assert route(call({"type": "track", "userId": "u", "event": event}), TABLE).dropped is None
    # ios does not block "Debug Event"
    result = route(call({"type": "track", "userId": "u", "event": "Debug Event"}, "ios"), TABLE)
    assert ids(result) == ["hooks-a"]


@pytest.mark.parametrize(
    "raw",
    [
        {"type": "page", "userId": "u", "name": "Debug Event"},
        {"type": "page", "userId": "u", "name": "Debug Event", "event": "Debug Event"},
        {"type": "screen", "userId": "u", "name": "Debug Event", "event": "Heartbeat"},
        {"type": "identify", "userId": "u", "event": "Debug Event"},
        {"type": "identify", "userId": "u", "traits": {"event": "Debug Event"}},
        {"type": "group", "userId": "u", "groupId": "Debug Event"},
    ],
)
def test_only_track_calls_are_blocked(raw: dict[str, Any]) -> None:
    assert ids(route(call(raw), TABLE)) == ["hooks-a", "hooks-b"]


@pytest.mark.parametrize(
    ("integrations", "expected"),
    [
        ({}, ["hooks-a", "hooks-b"]),
        ({"All": True}, ["hooks-a", "hooks-b"]),
        ({"Webhooks": False}, ["hooks-a"]),
        ({"Hooks EU": False}, ["hooks-b"]),
        ({"All": False, "Webhooks": True}, ["hooks-b"]),
        ({"All": False, "Hooks EU": {"opt": 1}}, ["hooks-a"]),
        ({"webhooks": False}, ["hooks-a", "hooks-b"]),  # case-sensitive
        ({"Other Tool": False}, ["hooks-a", "hooks-b"]),
    ],
)
def test_integrations_filter(integrations: dict[str, Any], expected: list[str]) -> None:
    raw = {"type": "track", "userId": "u", "event": "E", "integrations": integrations}
    assert ids(route(call(raw), TABLE)) == expected


@pytest.mark.parametrize("integrations", [{"All": False}, {"Webhooks": False, "Hooks EU": False}])
def test_integrations_turning_everything_off(integrations: dict[str, Any]) -> None:
    raw = {"type": "identify", "userId": "u", "integrations": integrations}
    assert route(call(raw), TABLE) == Route(
        dropped=DropReason.NO_DESTINATION,
        excluded=(
            ("hooks-off", DropReason.DESTINATION_DISABLED),
            ("hooks-a", DropReason.INTEGRATIONS),
            ("hooks-b", DropReason.INTEGRATIONS),
        ),
    )


def test_each_connected_destination_left_out_is_named_with_its_reason() -> None:
    raw = {"type": "track", "userId": "u", "event": "E", "integrations": {"Hooks EU": False}}
    result = route(call(raw), TABLE)
    assert ids(result) == ["hooks-b"]
    assert result.excluded == (
        ("hooks-off", DropReason.DESTINATION_DISABLED),
        ("hooks-a", DropReason.INTEGRATIONS),
    )
    plain = route(call({"type": "identify", "userId": "u"}, "ios"), TABLE)
    assert plain.excluded == (("hooks-off", DropReason.DESTINATION_DISABLED),)


def test_integrations_cannot_enable_a_disabled_destination() -> None:
    raw = {"type": "identify", "userId": "u", "integrations": {"All": False, "Webhooks": True}}
    assert "hooks-off" not in ids(route(call(raw, "lonely"), TABLE))
    assert route(call(raw, "lonely"), TABLE).dropped is DropReason.NO_DESTINATION


def test_delete_calls_ignore_integrations() -> None:
    # a deletion request goes to every destination with the webhook destination enabled (seed §1.6)
    raw = {"type": "delete", "userId": "u", "integrations": {"All": False}}
    assert ids(route(call(raw), TABLE)) == ["hooks-a", "hooks-b"]


def test_drop_reason_labels() -> None:
    assert {r.value for r in DropReason} == {
        "blocked_event",
        "no_destination",
        "unknown_source",
        "integrations",
        "destination_disabled",
        "duplicate",
    }


def test_a_delivery_key_names_its_destination() -> None:
    raw = {"type": "track", "event": "E", "userId": "u/1"}
    call = parse_call(raw, source_id="web", received_at=1)
    assert key_destination(delivery_key("hooks.a:1", call)) == "hooks.a:1"  # "/" in the user id
    assert key_destination(b"no-slash") == key_destination(None) == key_destination(b"") == ""
