"""The ordering state's layout, and the held users it tells of.

The deliver role keeps the holds of ordered destinations (``pipeline.roles.holds``) in a
partition state (``pipeline.kafka.partition_state``) whose changelog is the compacted topic
``Topics.changelog("ordering")``, one partition per ``deliveries`` partition. Its keys
(``key``: a delivery's Kafka key, ``<destination>/<user>``):

- ``h\\x00<key>`` → the user is held: the value's time (its first 8 bytes, big-endian epoch ms)
  is since when, the rest the messageId of the call it is held behind (``SPILLED``, empty: no
  call holds it, its lane keeps its backlog there: not a held user);
- ``q\\x00<key>\\x00<offset>`` (8 bytes, big-endian) → a call queued behind the hold;

a tombstone deletes a key, and an entry older than ``RETENTION`` reads as absent.

``HeldTally`` reads those records back (``pipeline stats``, the console): the latest value per
key, held users only, counted per destination.

    >>> tally = HeldTally()
    >>> tally.take(b"h\\x00hooks/u1", (1_000).to_bytes(8, "big") + b"m-1")
    >>> tally.take(b"q\\x00hooks/u1\\x00" + (7).to_bytes(8, "big"), (1_500).to_bytes(8, "big"))
    >>> tally.summary(now_ms=61_000)
    {'hooks': HeldUsers(count=1, oldest_since=1000, oldest_user='u1', oldest_blocker='m-1')}
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.timestamps import format_timestamp

__all__ = [
    "HELD",
    "QUEUED",
    "OFFSET_BYTES",
    "RETENTION",
    "SPILLED",
    "HeldTally",
    "HeldUsers",
    "age_text",
]

#: The prefix of a held user's key.
HELD = b"h\x00"
#: The prefix of a queued call's key.
QUEUED = b"q\x00"
#: A queued call's ``deliveries`` offset at the end of its key, big-endian.
OFFSET_BYTES = 8
#: Held calls are kept at most this long (a hold lasts at most its blocker's retry deadline,
#: 7 days at most; this is a safety net, not a schedule).
RETENTION = 30 * 86400.0
#: The blocker of a user whose lane spilled its backlog to the state: no call of it waits in a
#: retry tier, so it is not a held user (as the deliver role's gauge counts them).
SPILLED = ""

#: A state value's time: its first 8 bytes (``pipeline.kafka.partition_state.encode_value``).
_TIME_BYTES = 8


@dataclass(frozen=True, slots=True)
class HeldUsers:
    """A destination's held users: how many, and the one held longest (since when, epoch ms;
    its user id; the messageId of the call it is held behind)."""

    count: int
    oldest_since: int
    oldest_user: str
    oldest_blocker: str

    def since_text(self, now_ms: int) -> str:
        """``2026-11-26T16:01:02Z, 4m ago``: since when the oldest hold is."""
        second = format_timestamp(self.oldest_since)[:-5] + "Z"  # without the milliseconds
        return f"{second}, {age_text(now_ms - self.oldest_since)} ago"


def age_text(ms: int) -> str:
    """A time span in its largest whole unit: ``45s``, ``4m``, ``3h``, ``2d``.

    >>> age_text(245_000), age_text(-5)
    ('4m', '0s')
    """
    seconds = max(0, ms) // 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


class HeldTally:
    """The held users in changelog records taken in order: a key's latest value wins, a
    tombstone deletes it; queued calls, spilled lanes and other keys are left out."""

    def __init__(self) -> None:
        #: destination → user → (since, blocker).
        self._held: dict[str, dict[str, tuple[int, str]]] = {}

    def take(self, key: bytes | None, value: bytes | None) -> None:
        """One changelog record (``value`` ``None``: a tombstone)."""
        if key is None or not key.startswith(HELD):
            return
        destination, _, user = key[len(HELD) :].decode(errors="replace").partition("/")
        users = self._held.setdefault(destination, {})
        if value is None or len(value) < _TIME_BYTES:  # deleted (a value without a time: unread)
            users.pop(user, None)
            if not users:
                del self._held[destination]
            return
        since = int.from_bytes(value[:_TIME_BYTES], "big", signed=True)
        users[user] = (since, value[_TIME_BYTES:].decode(errors="replace"))

    def of(self, destination: str, now_ms: int) -> HeldUsers | None:
        """``destination``'s held users now (``None``: none), those past ``RETENTION`` left out
        as the state leaves them out."""
        oldest_kept = now_ms - int(RETENTION * 1000)
        count = 0
        oldest: tuple[int, str, str] | None = None
        for user, (since, blocker) in self._held.get(destination, {}).items():
            if since < oldest_kept or blocker == SPILLED:
                continue
            count += 1
            if oldest is None or (since, user) < oldest[:2]:
                oldest = (since, user, blocker)
        if oldest is None:
            return None
        return HeldUsers(count, *oldest)

    def summary(self, now_ms: int) -> dict[str, HeldUsers]:
        """Every destination with held users now, by id."""
        found = {}
        for destination in sorted(self._held):
            held = self.of(destination, now_ms)
            if held is not None:
                found[destination] = held
        return found
