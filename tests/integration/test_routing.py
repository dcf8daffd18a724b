"""Routing: integrations map (seed §4.3 rule 6), blocked events (rule 7), toggles, live config."""

from __future__ import annotations

from tests.support import apply, send_calls, stays, wait_for


def _two_destinations(webhooks_url: str, other_url: str, **webhooks: object) -> dict:
    return {
        "sources": [{"id": "web", "write_keys": ["wk"], "blocked_events": ["Debug Event"]}],
        "destinations": [
            {
                "id": "hooks",
                "name": "Webhooks",
                "sources": ["web"],
                "webhooks": [{"url": webhooks_url}],
                **webhooks,
            },
            # Receives every call: once it has the sentinel, the router has handled all before it.
            {"id": "other", "name": "Other", "sources": ["web"], "webhooks": [{"url": other_url}]},
        ],
    }


def _track(event: str, integrations: dict | None = None) -> dict:
    call = {"type": "track", "userId": "u1", "event": event}
    if integrations is not None:
        call["integrations"] = integrations
    return call


def test_integrations_map_selects_destinations(settings, receiver_factory, worker_factory):
    hooks, other = receiver_factory(), receiver_factory()
    apply(settings, _two_destinations(hooks.url, other.url))
    worker_factory(settings)
    send_calls(
        settings,
        [
            _track("all-off", {"All": False}),
            _track("all-off-webhooks-on", {"All": False, "Webhooks": True}),
            _track("webhooks-off", {"Webhooks": False}),
            _track("wrong-case", {"webhooks": False}),
            _track("default"),
            _track("options-object", {"All": False, "Webhooks": {"anything": 1}}),
        ],
        "wk",
    )
    wait_for(lambda: hooks.count() >= 4)
    wait_for(
        lambda: {b["event"] for b in other.bodies()} >= {"wrong-case", "default", "webhooks-off"}
    )
    assert stays(lambda: hooks.count() == 4)
    assert sorted(b["event"] for b in hooks.bodies()) == [
        "all-off-webhooks-on",
        "default",
        "options-object",
        "wrong-case",
    ]
    # "All": false also turns off Other, which is not named true.
    assert sorted(b["event"] for b in other.bodies()) == ["default", "webhooks-off", "wrong-case"]


def test_disabled_destination_and_blocked_event_receive_nothing(
    settings, receiver_factory, worker_factory
):
    hooks, other = receiver_factory(), receiver_factory()
    apply(settings, _two_destinations(hooks.url, other.url, enabled=False))
    worker_factory(settings)
    send_calls(
        settings,
        [
            _track("Debug Event"),
            {"type": "page", "userId": "u1", "name": "Debug Event"},
            _track("sentinel"),
        ],
        "wk",
    )
    wait_for(lambda: other.count() >= 2)  # the page and the sentinel, in either order
    assert stays(lambda: hooks.count() == 0)
    # The blocked track event stops at the router; a page of the same name is not a track event.
    assert sorted((b["type"], b.get("event") or b["name"]) for b in other.bodies()) == [
        ("page", "Debug Event"),
        ("track", "sentinel"),
    ]


def test_config_changes_are_picked_up_live(settings, receiver_factory, worker_factory):
    first, second, other = receiver_factory(), receiver_factory(), receiver_factory()
    apply(settings, _two_destinations(first.url, other.url, enabled=False))
    worker_factory(settings)

    send_calls(settings, [_track("while-disabled")], "wk")
    wait_for(lambda: other.count() == 1)
    assert stays(lambda: first.count() == 0, 0.5)

    apply(settings, _two_destinations(first.url, other.url, enabled=True))
    wait_for(lambda: _delivered_after_change(settings, first, "after-enable"))

    secret = "rotated-secret"
    apply(settings, _two_destinations(second.url, other.url, shared_secret=secret))
    wait_for(lambda: _delivered_after_change(settings, second, "after-new-url"))
    assert all("X-Signature" in r.headers for r in second.requests)


def _delivered_after_change(settings, receiver, event: str) -> bool:
    """Send a call and report whether it reached ``receiver`` (config propagation takes a moment)."""
    if any(b.get("event") == event for b in receiver.bodies()):
        return True
    send_calls(settings, [_track(event)], "wk")
    try:
        wait_for(lambda: any(b.get("event") == event for b in receiver.bodies()), timeout=2)
        return True
    except AssertionError:
        return False
