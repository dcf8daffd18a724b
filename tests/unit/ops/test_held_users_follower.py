"""The console's follower of held users, fed records as its topic follower would feed them (no
broker: the follower's thread is not started)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.held_users import HELD, QUEUED, HeldUsers
from pipeline.core.settings import Settings
from pipeline.ops.ordering import HeldUsersFollower

NOW = 1_795_708_862_345


@dataclass
class Record:
    _key: bytes | None
    _value: bytes | None

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value


def at(ms: int, payload: bytes = b"") -> bytes:
    return ms.to_bytes(8, "big") + payload


def test_records_taken_in_batches_tell_each_destinations_held_users() -> None:
    follower = HeldUsersFollower(Settings(bootstrap_servers="127.0.0.1:1", topic_prefix="t."))
    assert not follower.ready
    follower._take(
        [
            Record(HELD + b"hooks/u1", at(NOW - 60_000, b"m-1")),
            Record(HELD + b"hooks/u2", at(NOW - 1_000, b"m-2")),
            Record(QUEUED + b"hooks/u1\x00" + (5).to_bytes(8, "big"), at(NOW, b"call")),
        ]  # type: ignore[list-item]
    )
    assert follower.of("hooks", NOW) == HeldUsers(2, NOW - 60_000, "u1", "m-1")
    follower._take([Record(HELD + b"hooks/u1", None)])  # type: ignore[list-item]
    assert follower.of("hooks", NOW) == HeldUsers(1, NOW - 1_000, "u2", "m-2")
    follower._take([Record(HELD + b"hooks/u2", None)])  # type: ignore[list-item]
    assert follower.of("hooks", NOW) is None
