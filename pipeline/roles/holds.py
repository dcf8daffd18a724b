"""The held users of ordered destinations and their queued calls, in the deliver role's partition
state (``pipeline.kafka.partition_state``, changelog ``state.ordering.changelog``; its key layout:
``pipeline.core.held_users``), and the release records that end a hold. The lanes that use them:
``pipeline.roles.ordering``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from pipeline.core.held_users import HELD as _HELD
from pipeline.core.held_users import OFFSET_BYTES as _OFFSET_BYTES
from pipeline.core.held_users import QUEUED as _QUEUED
from pipeline.core.held_users import RETENTION, SPILLED
from pipeline.core.records import Delivery
from pipeline.core.routing import key_destination
from pipeline.core.topics import Topics
from pipeline.kafka.errors import Headed, Outgoing
from pipeline.kafka.partition_state import Changes, PartitionState, encode_value
from pipeline.runtime import metrics

__all__ = [
    "RELEASE_HEADER",
    "SWEEP",
    "MORE",
    "SPILLED",
    "RETENTION",
    "Change",
    "Hold",
    "Holds",
    "Release",
    "hold_change",
    "unhold_change",
    "queue_change",
    "queued_call",
    "QueuedCall",
    "unqueue_change",
    "release_record",
    "release_of",
]

#: The header of a release record: ``<outcome> <source> <call type> <messageId>`` of the call
#: that held its user (outcome ``sweep``: the destination's holds are released whatever holds
#: them; ``more``: the lane goes on with the queue of the hold behind that messageId, ``""`` for
#: a lane's own).
RELEASE_HEADER = "pipeline-release"
SWEEP = "sweep"
MORE = "more"


def _held_key(key: bytes) -> bytes:
    return _HELD + key


def _queue_prefix(key: bytes) -> bytes:
    return _QUEUED + key + b"\x00"


def _queued_key(key: bytes, offset: int) -> bytes:
    return _queue_prefix(key) + offset.to_bytes(_OFFSET_BYTES, "big")


class Hold(NamedTuple):
    """A held user: since when (epoch ms), behind which call."""

    since: int
    blocker: str


class Release(NamedTuple):
    """A release record's header: the outcome of the call that held the user, and the call."""

    outcome: str
    source: str
    call_type: str
    message_id: str


def release_record(
    topics: Topics,
    key: bytes | None,
    outcome: str,
    record: Delivery | None = None,
    *,
    blocker: str = "-",
) -> Outgoing | Headed:
    """The release record of ``record``'s user (``key``) once ``record`` has ``outcome``; without
    a record (a lane's own, ``MORE``, or the sweep's): the ``blocker`` whose hold it goes on
    with."""
    if record is None:
        text = f"{outcome} - - {blocker}"
    else:
        text = f"{outcome} {record.source_id} {record.call_type} {record.message_id}"
    return (topics.deliveries, key, b"", [(RELEASE_HEADER, text.encode())])


def release_of(message: Any) -> Release | None:
    """The release header of a consumed record (``None``: it is not a release)."""
    headers = message.headers()
    if not headers:
        return None
    for name, value in headers:
        if name == RELEASE_HEADER and isinstance(value, bytes):
            parts = value.decode(errors="replace").split(" ", 3)
            if len(parts) == 4:
                return Release(*parts)
    return None


#: A change to the holds: (state key, value or ``None`` to delete it, change to the held count).
Change = tuple[bytes, bytes | None, int]


def hold_change(key: bytes, blocker: str, before: Hold | None) -> Change:
    """``key``'s user held behind ``blocker`` (``before``: its hold until now, if it had one:
    the user is held since then)."""
    since = _now_ms() if before is None else before.since
    counted = _counted(blocker) - (0 if before is None else _counted(before.blocker))
    return (_held_key(key), encode_value(since, blocker.encode()), counted)


def _counted(blocker: str) -> int:
    return 0 if blocker == SPILLED else 1


def unhold_change(key: bytes, hold: Hold) -> Change:
    """The end of ``key``'s ``hold``."""
    return (_held_key(key), None, -_counted(hold.blocker))


def queue_change(key: bytes, offset: int, value: bytes, traceparent: bytes = b"") -> Change:
    """The call at ``offset`` of ``deliveries`` (its value as consumed; ``traceparent``: its trace
    context, if any) queued behind the hold."""
    return (_queued_key(key, offset), encode_value(_now_ms(), _stored(value, traceparent)), 0)


#: A queued call stored with its trace context starts with this byte (a record's value never
#: does: Avro's single-object header is C3 01, Confluent's wire format starts with 0), then the
#: traceparent's length (1 byte) and the traceparent.
_TRACED = b"\xff"


def _stored(value: bytes, traceparent: bytes) -> bytes:
    if not traceparent or len(traceparent) > 255:
        return value
    return _TRACED + bytes((len(traceparent),)) + traceparent + value


def queued_call(stored: bytes) -> tuple[bytes, bytes]:
    """A queued call as ``Holds.queued`` gives it (``stored``): its value, and its traceparent
    (``b""``: none)."""
    if not stored.startswith(_TRACED):
        return stored, b""
    end = 2 + stored[1]
    return stored[end:], stored[2:end]


class QueuedCall(NamedTuple):
    """A call queued behind its user's hold (``Holds.queued``)."""

    state_key: bytes
    #: Its offset on ``deliveries``.
    offset: int
    #: The call as stored (``queued_call`` reads it).
    stored: bytes
    #: When it was queued (epoch ms): the state's own time of the entry.
    queued_at: int


def unqueue_change(state_key: bytes) -> Change:
    return (state_key, None, 0)


class Holds:
    """The held users and queued calls of the ``deliveries`` partitions this process owns, on a
    ``PartitionState``; and how many users each destination has held (the gauge
    ``pipeline_ordering_held_users``)."""

    def __init__(self, state: PartitionState) -> None:
        self.state = state
        #: partition → destination → users held there.
        self._counts: dict[int, dict[str, int]] = {}
        #: The destinations with users held here (their gauge is set).
        self._labels: set[str] = set()
        #: partition → the delivery keys held there (a spilled lane's too), as ``commit`` left
        #: them: a user not in it is not held, known without reading the state (every fresh
        #: call of an ordered destination asks). Read on the event loop; a partition's set is
        #: replaced whole when it is assigned, before its records are read.
        self._held: dict[int, set[bytes]] = {}
        # One deliver role a process: its gauge starts from what this one holds (a role run
        # again in the same process, as tests do, does not inherit the last one's figures).
        metrics.ORDERING_HELD_USERS.clear()

    # ---- partitions ----------------------------------------------------------------------------

    def assigned(self, partitions: Sequence[int], *, restore: bool = True) -> None:
        """Restore the partitions' state (blocking) and count their holds (``restore=False``:
        the local stores as they are)."""
        self.state.assigned(partitions, restore=restore)
        now = _now_ms()
        for partition in partitions:
            counts: dict[str, int] = {}
            held: set[bytes] = set()
            for key, (_, blocker) in self.state.scan(partition, _HELD, now):
                held.add(key[len(_HELD) :])
                if blocker == SPILLED.encode():
                    continue
                destination = key_destination(key[len(_HELD) :])
                counts[destination] = counts.get(destination, 0) + 1
            self._counts[partition] = counts
            self._held[partition] = held
        self._gauge()

    def released(self, partitions: Sequence[int]) -> None:
        for partition in partitions:
            self._counts.pop(partition, None)
            self._held.pop(partition, None)
        self.state.released(partitions)
        self._gauge()

    def close(self) -> None:
        self.state.close()

    # ---- reading ---------------------------------------------------------------------------------

    def held(self, partition: int, key: bytes) -> Hold | None:
        held = self._held.get(partition)
        if held is not None and key not in held:
            return None
        found = self.state.get_many(partition, [_held_key(key)], _now_ms())[0]
        if found is None:
            return None
        return Hold(found[0], found[1].decode(errors="replace"))

    def queued(self, partition: int, key: bytes, limit: int | None = None) -> list[QueuedCall]:
        """The user's queued calls, oldest first (the first ``limit``)."""
        prefix = _queue_prefix(key)
        found = []
        for state_key, (at, value) in self.state.scan(partition, prefix, _now_ms(), limit):
            suffix = state_key[len(prefix) :]
            if len(suffix) == _OFFSET_BYTES:  # not another user's whose id goes on past a NUL
                found.append(QueuedCall(state_key, int.from_bytes(suffix, "big"), value, at))
        return found

    def held_keys(self, partition: int, destination: str) -> list[bytes]:
        """The delivery keys of ``destination``'s users held in ``partition``."""
        prefix = _HELD + destination.encode() + b"/"
        return [key[len(_HELD) :] for key, _ in self.state.scan(partition, prefix, _now_ms())]

    def holding(self, destination: str) -> bool:
        """Whether a user of ``destination`` is held here (asked of every fresh record)."""
        return destination in self._labels

    def counts(self) -> dict[int, dict[str, int]]:
        """Partition → destination → users held there."""
        return self._counts

    # ---- changing --------------------------------------------------------------------------------

    def commit(self, partition: int, changes: Sequence[Change]) -> Changes | None:
        """Stage ``changes`` and take them, with whatever else is staged for the partition (the
        caller stages and takes without yielding: nothing of another lane is staged then)."""
        counts = self._counts.setdefault(partition, {})
        held = self._held.get(partition)
        counted = False
        for state_key, value, by in changes:
            self.state.stage(partition, state_key, value)
            if held is not None and state_key.startswith(_HELD):
                if value is None:
                    held.discard(state_key[len(_HELD) :])
                else:
                    held.add(state_key[len(_HELD) :])
            if by:
                destination = key_destination(state_key[len(_HELD) :])
                counts[destination] = max(0, counts.get(destination, 0) + by)
                counted = True
        if counted:
            self._gauge()
        return self.state.take(partition)

    def _gauge(self) -> None:
        total = dict.fromkeys(self._labels, 0)
        for counts in list(self._counts.values()):
            for destination, count in counts.items():
                total[destination] = total.get(destination, 0) + count
        self._labels = {destination for destination, count in total.items() if count}
        for destination, count in total.items():
            metrics.ORDERING_HELD_USERS.labels(metrics.destination_label(destination)).set(count)


def _now_ms() -> int:
    return int(time.time() * 1000)
