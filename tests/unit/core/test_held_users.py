"""Held users read back from the ordering changelog's records: the key and value layout, the
latest value per key, tombstones, queued calls left out, the retention, the oldest hold."""

from __future__ import annotations

import pytest

from pipeline.core.held_users import (
    HELD,
    QUEUED,
    RETENTION,
    SPILLED,
    HeldTally,
    HeldUsers,
    age_text,
)

DAY_MS = 86_400_000
NOW = 100 * DAY_MS


def held(destination_user: str) -> bytes:
    return HELD + destination_user.encode()


def value(since: int, blocker: str = "m") -> bytes:
    return since.to_bytes(8, "big", signed=True) + blocker.encode()


def queued(destination_user: str, offset: int) -> bytes:
    return QUEUED + destination_user.encode() + b"\x00" + offset.to_bytes(8, "big")


def tally(*records: tuple[bytes | None, bytes | None]) -> HeldTally:
    found = HeldTally()
    for key, data in records:
        found.take(key, data)
    return found


def test_counts_held_users_per_destination_with_the_oldest() -> None:
    found = tally(
        (held("hooks/u1"), value(NOW - 5_000, "m-1")),
        (held("hooks/u2"), value(NOW - 9_000, "m-2")),
        (held("hooks/u3"), value(NOW - 1_000, "m-3")),
        (held("crm/u1"), value(NOW - 2_000, "m-4")),
    )
    assert found.summary(NOW) == {
        "crm": HeldUsers(1, NOW - 2_000, "u1", "m-4"),
        "hooks": HeldUsers(3, NOW - 9_000, "u2", "m-2"),
    }
    assert found.of("hooks", NOW) == HeldUsers(3, NOW - 9_000, "u2", "m-2")
    assert found.of("other", NOW) is None


def test_the_latest_value_of_a_key_wins_and_a_tombstone_deletes_it() -> None:
    found = tally(
        (held("hooks/u1"), value(NOW - 5_000, "m-1")),
        (held("hooks/u1"), value(NOW - 5_000, "m-9")),  # held behind another call since then
        (held("hooks/u2"), value(NOW - 9_000, "m-2")),
        (held("hooks/u2"), None),
        (held("gone/u1"), value(NOW - 1_000)),
        (held("gone/u1"), None),
    )
    assert found.summary(NOW) == {"hooks": HeldUsers(1, NOW - 5_000, "u1", "m-9")}
    # Held again after its tombstone: counted again.
    found.take(held("hooks/u2"), value(NOW - 100, "m-5"))
    assert found.of("hooks", NOW) == HeldUsers(2, NOW - 5_000, "u1", "m-9")


def test_queued_calls_and_other_keys_do_not_count() -> None:
    found = tally(
        (queued("hooks/u1", 7), value(NOW - 5_000, "avro bytes")),
        (queued("hooks/u1", 8), None),
        (b"x\x00hooks/u1", value(NOW)),
        (b"hooks/u1", value(NOW)),
        (None, value(NOW)),
    )
    assert found.summary(NOW) == {}


def test_a_spilled_lane_is_not_a_held_user_until_a_blocker_takes_its_place() -> None:
    found = tally(
        (held("hooks/u1"), value(NOW - 5_000, SPILLED)),
        (held("hooks/u2"), value(NOW - 1_000, "m-2")),
    )
    assert found.summary(NOW) == {"hooks": HeldUsers(1, NOW - 1_000, "u2", "m-2")}
    found.take(held("hooks/u1"), value(NOW - 5_000, "m-1"))
    assert found.of("hooks", NOW) == HeldUsers(2, NOW - 5_000, "u1", "m-1")
    found.take(held("hooks/u2"), value(NOW - 1_000, SPILLED))
    found.take(held("hooks/u1"), value(NOW - 5_000, SPILLED))
    assert found.summary(NOW) == {}


def test_holds_past_the_retention_are_left_out_as_the_state_leaves_them() -> None:
    retention_ms = int(RETENTION * 1000)
    found = tally(
        (held("hooks/old"), value(NOW - retention_ms - 1)),
        (held("hooks/edge"), value(NOW - retention_ms, "m-edge")),
        (held("stale/u1"), value(NOW - retention_ms - 1)),
    )
    assert found.summary(NOW) == {"hooks": HeldUsers(1, NOW - retention_ms, "edge", "m-edge")}


def test_odd_keys_and_values_are_read_without_failing() -> None:
    found = tally(
        (held("hooks/u/with/slashes"), value(NOW - 1, "m\xe9")),
        (held("nouser"), value(NOW - 2)),
        (HELD + b"bad\xff/u\xfe", value(NOW - 3, "m")),
        (held("short/u1"), b"\x00\x01"),  # no time: not a hold
    )
    summary = found.summary(NOW)
    assert summary["hooks"] == HeldUsers(1, NOW - 1, "u/with/slashes", "m\xe9")
    assert summary["nouser"].oldest_user == ""
    assert summary["bad\ufffd"].oldest_user == "u\ufffd"
    assert "short" not in summary


def test_equal_times_pick_one_oldest_user_whatever_the_order() -> None:
    one = tally((held("d/b"), value(NOW - 1)), (held("d/a"), value(NOW - 1)))
    other = tally((held("d/a"), value(NOW - 1)), (held("d/b"), value(NOW - 1)))
    assert one.summary(NOW) == other.summary(NOW)
    assert one.summary(NOW)["d"].oldest_user == "a"


@pytest.mark.parametrize(
    ("ms", "text"),
    [(0, "0s"), (999, "0s"), (59_999, "59s"), (60_000, "1m"), (245_000, "4m"),
     (3_600_000, "1h"), (86_399_999, "23h"), (3 * DAY_MS, "3d"), (-10, "0s")],
)  # fmt: skip
def test_age_text(ms: int, text: str) -> None:
    assert age_text(ms) == text


def test_since_text_drops_the_milliseconds() -> None:
    held_users = HeldUsers(3, 1_795_708_862_345, "u", "m")  # 2026-11-26T16:01:02.345Z
    assert held_users.since_text(1_795_708_862_345 + 240_100) == "2026-11-26T16:01:02Z, 4m ago"
