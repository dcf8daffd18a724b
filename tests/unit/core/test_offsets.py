"""Unit tests for pipeline.core.offsets: commit the highest contiguous finished offset."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.offsets import PartitionOffsets


def tracker(*offsets: int) -> PartitionOffsets:
    t = PartitionOffsets()
    for offset in offsets:
        t.add(offset)
    return t


def test_nothing_taken_nothing_to_commit() -> None:
    t = PartitionOffsets()
    assert t.position() is None
    assert len(t) == 0


def test_in_order_finishes() -> None:
    t = tracker(0, 1, 2)
    assert len(t) == 3
    assert t.position() is None
    t.finish(0)
    assert t.position() == 1
    t.finish(1)
    assert t.position() == 2
    t.finish(2)
    assert t.position() == 3
    assert len(t) == 0


def test_out_of_order_finishes_wait_for_the_head() -> None:
    t = tracker(5, 6, 7, 8)
    t.finish(7)
    t.finish(6)
    assert t.position() is None  # 5 is still in flight
    assert len(t) == 2
    t.finish(5)
    assert t.position() == 8  # 5, 6, 7 done; 8 in flight
    assert len(t) == 1
    t.finish(8)
    assert t.position() == 9


def test_gaps_in_offsets() -> None:
    # compacted topics and transaction markers leave gaps; position is one past the last finished
    t = tracker(10, 20, 30)
    t.finish(10)
    assert t.position() == 11
    t.finish(30)
    assert t.position() == 11
    t.finish(20)
    assert t.position() == 31


def test_position_is_none_when_nothing_new_since_commit() -> None:
    t = tracker(0, 1, 2)
    t.finish(0)
    assert t.position() == 1
    t.committed(1)
    assert t.position() is None
    t.finish(2)
    assert t.position() is None  # 1 still in flight
    t.finish(1)
    assert t.position() == 3
    t.committed(3)
    assert t.position() is None
    t.add(3)
    assert t.position() is None
    t.finish(3)
    assert t.position() == 4


def test_committed_older_position_still_reports_the_new_one() -> None:
    t = tracker(0, 1)
    t.finish(0)
    t.finish(1)
    t.committed(1)  # a commit of an earlier position completed late
    assert t.position() == 2


def test_offsets_must_increase() -> None:
    t = tracker(5)
    with pytest.raises(ValueError, match="not after 5"):
        t.add(5)
    with pytest.raises(ValueError, match="not after 5"):
        t.add(4)
    t.add(6)


def test_forget_from_drops_the_tail() -> None:
    t = tracker(1, 2, 3, 4)
    t.finish(3)
    t.forget_from(3)  # a seek back to 3: 3 and 4 will be consumed again
    assert len(t) == 2
    t.finish(2)
    t.finish(1)
    assert t.position() == 3  # not 4: 3's earlier finish was forgotten
    t.add(3)  # consumed again after the seek
    t.add(4)
    t.finish(4)
    assert t.position() == 3
    t.finish(3)
    assert t.position() == 5


def test_forget_from_before_everything_and_after_everything() -> None:
    t = tracker(1, 2)
    t.forget_from(10)
    assert len(t) == 2
    t.forget_from(0)
    assert len(t) == 0
    assert t.position() is None
    t.add(1)
    t.finish(1)
    assert t.position() == 2


def test_forget_keeps_finished_position() -> None:
    t = tracker(1, 2, 3)
    t.finish(1)
    t.forget_from(2)
    assert t.position() == 2


@st.composite
def scenario(draw: st.DrawFn) -> tuple[list[int], list[int]]:
    gaps = draw(st.lists(st.integers(1, 3), min_size=1, max_size=30))
    offsets = []
    current = draw(st.integers(0, 100))
    for gap in gaps:
        offsets.append(current)
        current += gap
    order = draw(st.permutations(offsets))
    return offsets, list(order)


@settings(max_examples=200)
@given(scenario())
def test_position_is_one_past_the_highest_contiguous_finished(
    case: tuple[list[int], list[int]],
) -> None:
    offsets, order = case
    t = tracker(*offsets)
    finished: set[int] = set()
    last: int | None = None
    for offset in order:
        t.finish(offset)
        finished.add(offset)
        contiguous = 0
        while contiguous < len(offsets) and offsets[contiguous] in finished:
            contiguous += 1
        expected = offsets[contiguous - 1] + 1 if contiguous else None
        position = t.position()
        if expected is None:
            assert position is None
        else:
            assert position == expected
            # never past an unfinished offset
            assert all(o in finished for o in offsets if o < position)
            if last is not None:
                assert position >= last
            last = position
        assert len(t) == len(offsets) - len(finished)
    assert t.position() == offsets[-1] + 1
