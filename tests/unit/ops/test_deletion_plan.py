"""Which sources a deletion request notifies. Pure logic."""

from __future__ import annotations

from pipeline.core.records import DeletionNotification, DeletionRequest, DeletionRequestEvent
from pipeline.ops.deletion import plan_notifications


def note(source: str, message_id: str, *, acked: bool, at: int = 1) -> DeletionNotification:
    return DeletionNotification(source, message_id, at, acknowledged=acked)


def record(*requests: list[DeletionNotification]) -> DeletionRequest:
    return DeletionRequest(
        "u", tuple(DeletionRequestEvent(0, notifications=tuple(r)) for r in requests)
    )


def test_first_request_notifies_every_affected_source() -> None:
    assert plan_notifications(None, ["ios", "web"], force=False) == (
        {"ios": None, "web": None},
        {},
    )


def test_repeat_notifies_nobody_already_notified() -> None:
    old = record([note("ios", "m1", acked=True, at=5), note("web", "m2", acked=True, at=5)])
    assert plan_notifications(old, ["ios", "web"], force=False) == ({}, {"ios": 5, "web": 5})


def test_repeat_notifies_a_source_connected_since() -> None:
    old = record([note("web", "m1", acked=True)])
    todo, already = plan_notifications(old, ["ios", "web"], force=False)
    assert todo == {"ios": None} and already == {"web": 1}


def test_force_notifies_every_affected_source_with_new_ids() -> None:
    old = record([note("web", "m1", acked=True), note("ios", "m2", acked=False)])
    assert plan_notifications(old, ["ios", "web"], force=True) == ({"ios": None, "web": None}, {})


def test_unacknowledged_notifications_are_sent_again_with_their_message_id() -> None:
    old = record([note("web", "m1", acked=False)])
    assert plan_notifications(old, ["web"], force=False) == ({"web": "m1"}, {})
    # ... unless a later request finished them.
    finished = record([note("web", "m1", acked=False)], [note("web", "m1", acked=True, at=9)])
    assert plan_notifications(finished, ["web"], force=False) == ({}, {"web": 9})


def test_sources_no_longer_affected_are_not_notified() -> None:
    old = record([note("web", "m1", acked=False)])
    assert plan_notifications(old, [], force=False) == ({}, {})
