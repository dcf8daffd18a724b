"""``pipeline.roles.dedupe`` and the partition state under it, without Kafka: the local stores
are real (RocksDB in a temporary directory), the changelog is what they would produce."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.core.calls import Call, CallType
from pipeline.core.settings import Settings
from pipeline.kafka.partition_state import (
    PartitionState,
    PartitionStore,
    StateUnavailable,
    decode_value,
)
from pipeline.roles.dedupe import MARGIN, Dedupe, dedupe_key

T0 = 1_800_000_000_000
WINDOW = 60.0


def call(
    message_id: str,
    source: str = "web",
    call_type: CallType = CallType.TRACK,
    received_at: int = T0,
) -> Call:
    return Call(call_type, message_id, source, timestamp=T0, received_at=received_at, user_id="u1")


def dedupe_in(tmp_path: Path, partitions: tuple[int, ...] = (0, 1)) -> Dedupe:
    state = PartitionState(
        Settings(),
        changelog="t.state.dedupe.changelog",
        directory=str(tmp_path),
        retention=WINDOW + MARGIN,
    )
    state.assigned(list(partitions), restore=False)
    return Dedupe(state, WINDOW)


def test_a_resend_is_recognised_within_a_batch_and_after_it(tmp_path: Path) -> None:
    dedupe = dedupe_in(tmp_path)
    first = dedupe.first_seen([(0, call("m1")), (0, call("m2")), (0, call("m1"))], T0)
    assert first == [None, None, T0]  # the second m1 is a resend of the first
    [changes] = dedupe.take([0])
    changelog = changes.records
    assert [(topic, key, partition) for topic, key, _, _, partition in changelog] == [
        ("t.state.dedupe.changelog", b"web\x00m1", 0),
        ("t.state.dedupe.changelog", b"web\x00m2", 0),
    ]
    assert decode_value(changelog[0][2] or b"") == (T0, b"")
    # Taken and not yet durable: read as the state's, and not taken again.
    assert dedupe.first_seen([(0, call("m1"))], T0 + 500) == [T0]
    assert dedupe.take([0]) == []
    dedupe.apply([changes])  # the hand-off is durable
    assert dedupe.first_seen([(0, call("m2")), (0, call("m3"))], T0 + 1000) == [T0, None]


def test_the_same_message_id_from_two_sources_is_two_calls(tmp_path: Path) -> None:
    dedupe = dedupe_in(tmp_path)
    assert dedupe.first_seen([(0, call("m1", "web")), (0, call("m1", "app"))], T0) == [None, None]
    assert dedupe_key(call("m1", "web")) != dedupe_key(call("m1", "app"))


def test_delete_calls_and_records_that_are_not_calls_are_never_resends(tmp_path: Path) -> None:
    dedupe = dedupe_in(tmp_path)
    delete = call("d1", call_type=CallType.DELETE)
    assert dedupe.first_seen([(0, delete), None, (0, delete)], T0) == [None, None, None]
    assert dedupe.take([0]) == []


def test_a_copy_received_past_the_window_of_the_first_is_not_a_resend(tmp_path: Path) -> None:
    dedupe = dedupe_in(tmp_path)
    dedupe.first_seen([(0, call("m1"))], T0)
    dedupe.apply(dedupe.take([0]))
    within = T0 + int(WINDOW * 1000)
    late = T0 + int(MARGIN * 1000)  # the router reads it this late: the window is the copies'
    assert dedupe.first_seen([(0, call("m1", received_at=within))], late) == [T0]
    assert dedupe.first_seen([(1, call("m9", received_at=within))], late) == [None]  # elsewhere
    past = call("m1", received_at=within + 1)
    assert dedupe.first_seen([(0, past)], within + 1) == [None]  # the window passed
    dedupe.apply(dedupe.take([0]))  # it starts a window of its own
    assert dedupe.first_seen([(0, call("m1", received_at=within + 2))], within + 2) == [within + 1]


def test_what_a_hand_off_that_did_not_happen_staged_is_forgotten(tmp_path: Path) -> None:
    dedupe = dedupe_in(tmp_path)
    dedupe.first_seen([(0, call("m1"))], T0)
    dedupe.discard([0])
    assert dedupe.first_seen([(0, call("m1"))], T0) == [None]
    taken = dedupe.take([0])  # taken for a hand-off, which then fails
    dedupe.discard([0])
    dedupe.apply(taken)  # too late: forgotten
    assert dedupe.first_seen([(0, call("m1"))], T0) == [None]


def test_the_local_store_keeps_what_was_applied_and_its_checkpoint(tmp_path: Path) -> None:
    dedupe = dedupe_in(tmp_path, partitions=(3,))
    dedupe.first_seen([(3, call("m1"))], T0)
    dedupe.apply(dedupe.take([3]))
    dedupe.state.released([3])  # closed (``close`` also asks Kafka where the changelog ends)
    again = dedupe_in(tmp_path, partitions=(3,))
    assert again.first_seen([(3, call("m1"))], T0) == [T0]
    store = PartitionStore(str(tmp_path / "other"), retention=WINDOW)
    assert store.checkpoint() == -1
    store.write([], checkpoint=41)
    assert store.checkpoint() == 41
    store.close()


def test_a_store_another_process_holds_is_left_alone_and_a_private_one_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two routers on one machine with the same state directory, the first not yet letting the
    partition go (stopped, say): the second must not empty the first's store."""
    first = dedupe_in(tmp_path, partitions=(3,))
    first.first_seen([(3, call("m1"))], T0)
    first.apply(first.take([3]))
    second = dedupe_in(tmp_path, partitions=(3,))  # the shared store's lock is the first's
    assert "held by another process on this machine" in caplog.text
    private = next(line for line in caplog.text.splitlines() if "a store of its own" in line)
    path = Path(private.rsplit(" at ", 1)[1])
    assert path.is_dir() and not path.is_relative_to(tmp_path)
    assert second.first_seen([(3, call("m2"))], T0) == [None]  # restored from the changelog
    assert first.first_seen([(3, call("m1"))], T0) == [T0]  # the first's store untouched
    second.state.released([3])
    assert not path.exists()  # a private store goes with the partition
    first.state.released([3])
    assert dedupe_in(tmp_path, partitions=(3,)).first_seen([(3, call("m1"))], T0) == [T0]


def test_a_store_that_cannot_be_made_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a file where the state directory should be\n")
    with pytest.raises(StateUnavailable) as info:
        dedupe_in(tmp_path / "taken", partitions=(2,))
    assert "t.state.dedupe.changelog[2]: cannot make a local store at " in str(info.value)
    assert str(tmp_path / "taken") in str(info.value)


def test_a_released_partitions_calls_read_as_new(tmp_path: Path) -> None:
    """Its records go to its new owner, which restores the state: this process forgets it."""
    dedupe = dedupe_in(tmp_path)
    dedupe.first_seen([(0, call("m1"))], T0)
    dedupe.apply(dedupe.take([0]))
    dedupe.state.released([0])
    assert dedupe.first_seen([(0, call("m1"))], T0) == [None]


def test_changes_applied_with_their_offset_move_the_checkpoint_once_none_before_them_wait(
    tmp_path: Path,
) -> None:
    """The checkpoint says where a restart's restore starts: it never passes changes that are
    not in the local store yet."""
    dedupe = dedupe_in(tmp_path, partitions=(0,))
    topic = dedupe.state.changelog_topic
    dedupe.first_seen([(0, call("m1"))], T0)
    first = dedupe.take([0])
    dedupe.first_seen([(0, call("m2"))], T0)
    second = dedupe.take([0])
    dedupe.apply(second, {(topic, 0): 8})
    assert dedupe.state.checkpoint(0) == -1  # m1's changes (offset 7) are not applied yet
    dedupe.apply(first, {(topic, 0): 7})
    assert dedupe.state.checkpoint(0) == 7  # harmless: a restore re-reads offset 8
    dedupe.first_seen([(0, call("m3"))], T0)
    dedupe.apply(dedupe.take([0]), {(topic, 0): 9})
    assert dedupe.state.checkpoint(0) == 9
    dedupe.first_seen([(0, call("m4"))], T0)
    dedupe.apply(dedupe.take([0]))  # no offset known (a transaction's): the checkpoint stays
    assert dedupe.state.checkpoint(0) == 9
