"""``pipeline stats``'s held users: one line per destination with held users, unknown when Kafka
does not answer, and the JSON fields of a row. Destination ids from outside print harmlessly."""

from __future__ import annotations

from pipeline.core.held_users import HeldUsers
from pipeline.store.format import HELD_UNKNOWN, format_held_users, held_users_json

SINCE = 1_795_708_862_345  # 2026-11-26T16:01:02.345Z


def test_a_line_per_destination_with_held_users() -> None:
    held = {
        "hooks": HeldUsers(3, SINCE, "u1", "m-1"),
        "crm": HeldUsers(1, SINCE - 3_600_000, "u9", "m-9"),
        "big": HeldUsers(12_345, SINCE, "u2", "m-2"),
    }
    assert format_held_users(held, SINCE + 240_000) == [
        "big: 12,345 users held (oldest since 2026-11-26T16:01:02Z, 4m ago)",
        "crm: 1 user held (oldest since 2026-11-26T15:01:02Z, 1h ago)",
        "hooks: 3 users held (oldest since 2026-11-26T16:01:02Z, 4m ago)",
    ]


def test_nothing_when_none_are_held_and_one_line_when_unknown() -> None:
    assert format_held_users({}, SINCE) == []
    assert format_held_users(None, SINCE) == [HELD_UNKNOWN]
    assert HELD_UNKNOWN == "held users: unknown (Kafka unreachable)"


def test_a_hostile_destination_id_prints_as_one_harmless_line() -> None:
    [line] = format_held_users({"ev\x1b[2J\nil": HeldUsers(1, SINCE, "u", "m")}, SINCE)
    assert line.isprintable() and line.startswith("ev\\x1b[2J\\nil: 1 user held")


def test_json_fields() -> None:
    assert held_users_json(HeldUsers(3, SINCE, "u1", "m-1")) == {
        "held_users": 3,
        "oldest_held_since": "2026-11-26T16:01:02.345Z",
        "oldest_held_user": "u1",
        "oldest_held_behind": "m-1",
    }
    none = {
        "held_users": 0,
        "oldest_held_since": None,
        "oldest_held_user": None,
        "oldest_held_behind": None,
    }
    assert held_users_json(None) == none
    assert held_users_json(None, known=False) == {**none, "held_users": None}
