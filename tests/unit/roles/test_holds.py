"""``pipeline.roles.holds``: the held users and queued calls of ordered destinations on a real
partition state (RocksDB in a temporary directory, the changelog what it would produce), and the
release records."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from pipeline.core.records import Delivery
from pipeline.core.settings import Settings
from pipeline.core.topics import Topics
from pipeline.kafka.partition_state import PartitionState, decode_value
from pipeline.roles.holds import (
    RELEASE_HEADER,
    RETENTION,
    SPILLED,
    Hold,
    Holds,
    Release,
    hold_change,
    queue_change,
    queued_call,
    release_of,
    release_record,
    unhold_change,
    unqueue_change,
)
from pipeline.roles.parking import PartMessage

CHANGELOG = "t.state.ordering.changelog"
NOW = int(time.time() * 1000)  # older than the retention reads as absent
KEY = b"hooks/u1"


def holds_in(tmp_path: Path, partitions: tuple[int, ...] = (0, 1)) -> Holds:
    state = PartitionState(
        Settings(), changelog=CHANGELOG, directory=str(tmp_path), retention=RETENTION
    )
    holds = Holds(state)
    state.assigned(list(partitions), restore=False)
    return holds


def gauge(destination: str) -> float:
    found = REGISTRY.get_sample_value("pipeline_ordering_held_users", {"destination": destination})
    return found or 0.0


def test_a_hold_and_its_queue_read_back_in_arrival_order(tmp_path: Path) -> None:
    holds = holds_in(tmp_path)
    taken = holds.commit(
        0,
        [
            hold_change(KEY, "m2", None),
            queue_change(KEY, 300, b"third"),  # offsets sort as numbers, not as text
            queue_change(KEY, 7, b"first"),
            queue_change(KEY, 20, b"second"),
        ],
    )
    assert taken is not None
    hold = holds.held(0, KEY)
    assert hold is not None and hold.blocker == "m2" and hold.since >= NOW
    assert [(offset, value) for _, offset, value, _ in holds.queued(0, KEY)] == [
        (7, b"first"),
        (20, b"second"),
        (300, b"third"),
    ]
    # Taken and not yet durable: read as the state's; once applied, from the store.
    holds.state.apply(taken)
    assert [offset for _, offset, _, _ in holds.queued(0, KEY, limit=2)] == [7, 20]
    assert holds.held(1, KEY) is None  # another partition's state
    # The changelog records: one per key, to the partition's own changelog partition.
    assert {(topic, partition) for topic, _, _, _, partition in taken.records} == {(CHANGELOG, 0)}
    [held] = [value for _, key, value, _, _ in taken.records if key == b"h\x00hooks/u1"]
    assert decode_value(held or b"") == (hold.since, b"m2")


def test_a_user_whose_id_goes_on_past_a_nul_is_another_user(tmp_path: Path) -> None:
    holds = holds_in(tmp_path)
    holds.commit(0, [queue_change(b"hooks/u1\x00x", 5, b"not u1's"), queue_change(KEY, 6, b"u1's")])
    assert [value for _, _, value, _ in holds.queued(0, KEY)] == [b"u1's"]


def test_a_queue_read_in_pieces_takes_changes_in_progress_into_account(tmp_path: Path) -> None:
    holds = holds_in(tmp_path)
    holds.state.apply(holds.commit(0, [queue_change(KEY, n, b"v") for n in range(10)]) or _none())
    # Unqueued in a hand-off in progress: the piece is what is left of the first four.
    holds.commit(0, [unqueue_change(key) for key, _, _, _ in holds.queued(0, KEY, limit=2)])
    assert [offset for _, offset, _, _ in holds.queued(0, KEY, limit=4)] == [2, 3]
    # One queued past the piece's end does not jump ahead of those not read yet.
    holds.commit(0, [queue_change(KEY, 99, b"late")])
    assert [offset for _, offset, _, _ in holds.queued(0, KEY, limit=4)] == [2, 3]
    assert [offset for _, offset, _, _ in holds.queued(0, KEY)] == [*range(2, 10), 99]


def test_held_users_are_counted_per_destination(tmp_path: Path) -> None:
    holds = holds_in(tmp_path)
    holds.commit(0, [hold_change(b"counted/u1", "m1", None)])
    holds.commit(1, [hold_change(b"counted/u2", "m2", None)])
    holds.commit(1, [hold_change(b"counted/u2", "m3", Hold(NOW, "m2"))])  # another blocker
    assert holds.holding("counted") and not holds.holding("hooks")
    assert gauge("counted") == 2
    assert holds.held_keys(1, "counted") == [b"counted/u2"]
    holds.commit(0, [unhold_change(b"counted/u1", Hold(NOW, "m1"))])
    assert gauge("counted") == 1
    # A lane's own spill is not a held user, and a blocker taking its place is.
    spilled = hold_change(b"counted/u3", SPILLED, None)
    holds.commit(0, [spilled])
    assert gauge("counted") == 1
    holds.commit(0, [hold_change(b"counted/u3", "m4", Hold(NOW, SPILLED))])
    assert gauge("counted") == 2
    holds.commit(0, [unhold_change(b"counted/u3", Hold(NOW, "m4"))])
    holds.released([1])  # the partition went: its holds are counted by its new owner
    assert gauge("counted") == 0 and not holds.holding("counted")


def test_counts_are_restored_with_the_partition(tmp_path: Path) -> None:
    holds = holds_in(tmp_path, (0,))
    taken = holds.commit(
        0, [hold_change(b"restored/u1", "m1", None), hold_change(b"restored/u2", SPILLED, None)]
    )
    holds.state.apply(taken or _none(), end=0)
    holds.close()
    again = holds_in(tmp_path, ())
    again.assigned([0], restore=False)  # the local store as it was, its holds counted
    assert again.counts()[0] == {"restored": 1}  # a spilled lane is not a held user


def test_release_records_name_the_call_and_read_back() -> None:
    topics = Topics("t.")
    record = Delivery(
        message_id="m 2",  # a messageId may hold spaces: it comes last
        source_id="web",
        destination_id="hooks",
        call_type="track",
        body=b"{}",
        received_at=1,
        not_before=1,
    )
    topic, key, value, headers = release_record(topics, KEY, "delivered", record)
    assert (topic, key, value) == (topics.deliveries, KEY, b"")
    assert release_of(PartMessage(key, value, headers)) == Release(
        "delivered", "web", "track", "m 2"
    )
    swept: Any = release_record(topics, KEY, "sweep")
    assert release_of(PartMessage(KEY, b"", swept[3])).outcome == "sweep"
    # A lane's own release goes on with the hold it names, a spilled lane's too.
    more: Any = release_record(topics, KEY, "more", blocker=SPILLED)
    assert release_of(PartMessage(KEY, b"", more[3])) == Release("more", "-", "-", SPILLED)
    assert release_of(PartMessage(KEY, b"v", [])) is None
    assert release_of(PartMessage(KEY, b"v", [(RELEASE_HEADER, b"short")])) is None


def _none() -> Any:
    raise AssertionError("nothing was taken")


def test_a_queued_call_keeps_its_trace_context_and_when_it_was_queued(tmp_path: Path) -> None:
    traceparent = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    avro = b"\xc3\x01" + b"\x00" * 8 + b"the call"
    holds = holds_in(tmp_path)
    changes = [queue_change(KEY, 1, avro, traceparent), queue_change(KEY, 2, avro)]
    assert holds.commit(0, [hold_change(KEY, "m0", None), *changes]) is not None
    traced, plain = holds.queued(0, KEY)
    assert queued_call(traced.stored) == (avro, traceparent) and traced.queued_at > 0
    assert queued_call(plain.stored) == (avro, b"")  # as written before trace contexts
    assert plain.queued_at > 0


def test_a_user_not_held_is_known_without_reading_the_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every fresh call of an ordered destination asks whether its user is held: the held keys
    of an assigned partition are known in memory, as commits change them and as the partition's
    state is restored; the state is read only for a user that is held."""
    holds = holds_in(tmp_path, ())
    holds.assigned([0], restore=False)
    reads: list[Any] = []
    read = holds.state.get_many
    monkeypatch.setattr(holds.state, "get_many", lambda *args: reads.append(args) or read(*args))
    assert holds.held(0, KEY) is None and reads == []
    holds.commit(0, [hold_change(KEY, "m1", None)])  # taken, not yet durable: held all the same
    hold = holds.held(0, KEY)
    assert hold is not None and hold.blocker == "m1" and len(reads) == 1
    holds.commit(0, [unhold_change(KEY, hold)])
    assert holds.held(0, KEY) is None and len(reads) == 1
    taken = holds.commit(0, [hold_change(b"hooks/u2", SPILLED, None)])  # a lane's own spill
    spill = holds.held(0, b"hooks/u2")
    assert spill is not None and spill.blocker == SPILLED
    holds.state.apply(taken or _none(), end=0)
    holds.close()
    again = holds_in(tmp_path, ())
    again.assigned([0], restore=False)
    restored = again.held(0, b"hooks/u2")
    assert restored is not None and restored.blocker == SPILLED
    assert again.held(0, KEY) is None
