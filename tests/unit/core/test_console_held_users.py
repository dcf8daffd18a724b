"""The console destination page's line about held users."""

from __future__ import annotations

from pipeline.core.config import Destination, Ordering, Webhook
from pipeline.core.console import held_users_text
from pipeline.core.held_users import HeldUsers

SINCE = 1_795_708_862_345  # 2026-11-26T16:01:02.345Z


def destination(ordering: Ordering) -> Destination:
    return Destination(
        id="hooks",
        sources=["web"],
        ordering=ordering,
        webhooks=[Webhook(url="https://hooks.example/in")],
    )


def test_an_ordered_destination_always_has_the_line() -> None:
    ordered = destination(Ordering.PER_USER)
    held = HeldUsers(3, SINCE, "u1", "m-1")
    assert held_users_text(ordered, held, known=True, now_ms=SINCE + 240_000) == (
        "Held users: 3 (oldest since 2026-11-26T16:01:02Z, 4m ago)"
    )
    assert held_users_text(ordered, None, known=True, now_ms=SINCE) == "Held users: 0"
    assert held_users_text(ordered, None, known=False, now_ms=SINCE) == (
        "Held users: unknown (the ordering changelog is not read yet)"
    )


def test_an_unordered_destination_has_it_only_while_users_are_held() -> None:
    unordered = destination(Ordering.NONE)
    assert held_users_text(unordered, None, known=True, now_ms=SINCE) is None
    assert held_users_text(unordered, None, known=False, now_ms=SINCE) is None
    held = HeldUsers(1_234, SINCE, "u1", "m-1")  # ordered until just now: the sweep releases
    assert held_users_text(unordered, held, known=True, now_ms=SINCE + 1) == (
        "Held users: 1,234 (oldest since 2026-11-26T16:01:02Z, 0s ago)"
    )
