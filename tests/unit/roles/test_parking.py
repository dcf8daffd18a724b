"""Parked batches: the value of a record carrying many parked records, read back exactly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.admission import Window
from pipeline.roles.parking import (
    PARTS_HEADER,
    PARTS_TRACE_HEADER,
    SCHEDULE_HEADER,
    ParkPlan,
    PartMessage,
    Schedule,
    entry_size,
    packed,
    schedule_header,
    schedule_of,
    trace_entries,
    unpacked,
)

_RECORDS = st.lists(
    st.tuples(st.none() | st.binary(max_size=40), st.binary(max_size=300)), min_size=1, max_size=20
)
HEADERS = [("pipeline-park", b"1 2 3 4 hooks"), (PARTS_HEADER, b"9")]


@given(records=_RECORDS)
def test_each_record_comes_back_as_it_went_in_with_the_park_header(
    records: list[tuple[bytes | None, bytes]],
) -> None:
    value = packed([(key, record, 0) for key, record in records])
    parts = unpacked(value, HEADERS)
    assert [(part.key(), part.value()) for part in parts] == records
    assert all(part.headers() == HEADERS[:1] for part in parts)  # the parts count is the batch's
    assert len(value) == sum(entry_size(key, record) for key, record in records)


@given(first=_RECORDS, second=_RECORDS)
def test_batches_join_as_they_are(
    first: list[tuple[bytes | None, bytes]], second: list[tuple[bytes | None, bytes]]
) -> None:
    """A batch parked again beside records or other batches is carried as it is."""
    one = packed([(key, record, 0) for key, record in first])
    joined = packed([(b"k", one, len(first)), *((key, record, 0) for key, record in second)])
    assert [(part.key(), part.value()) for part in unpacked(joined, [])] == first + second


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (b"", "an empty batch"),
        (b"\x00\x00\x00\x01", "cut short"),
        (b"\x00\x00\x00\x01\x00\x00\x00\x09kvalue", "past the batch's end"),
        (b"\x00\x00\x00\x09\x00\x00\x00\x01kv", "past the batch's end"),
        (b"\xff\xff\xff\xff\xff\xff\xff\xfe", "past the batch's end"),
    ],
)
def test_a_value_that_is_not_a_batch_is_refused_with_the_reason(value: bytes, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        unpacked(value, [])


def test_a_schedule_reads_back_with_its_window_started_or_not() -> None:
    """A record waiting by choice (``WAITS_BY_CHOICE``) has no window yet: 0 in the header, and
    ``None`` again when read (a 0 read as a window would have dead-lettered it at once)."""
    unstarted = schedule_of(PartMessage(b"k", b"v", [schedule_header(0, 5, None, None, "hooks")]))
    assert unstarted is not None and unstarted.window == Window(None, None)
    assert unstarted.header() == schedule_header(0, 5, None, None, "hooks")
    started = schedule_of(PartMessage(b"k", b"v", [schedule_header(1, 5, 3, 9, "hooks")]))
    assert started == Schedule(1, 5, 3, 9, "hooks") and started.window == Window(3, 9)


def test_each_part_of_a_parked_batch_keeps_its_own_trace_context() -> None:
    traced = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    value = packed([(b"k1", b"one", 0), (b"k2", b"two", 0), (b"k3", b"three", 0)])
    headers = [*HEADERS, (PARTS_TRACE_HEADER, b"- " + traced + b" -")]
    first, second, third = unpacked(value, headers, (1, 1234))
    assert dict(second.headers())["traceparent"] == traced
    assert "traceparent" not in dict(first.headers()) and "traceparent" not in dict(third.headers())
    assert PARTS_TRACE_HEADER not in dict(second.headers())
    assert second.timestamp() == (1, 1234)
    # A list that does not match the parts is not ours: the parts go on without traces.
    parts = unpacked(value, [*HEADERS, (PARTS_TRACE_HEADER, traced)])
    assert all("traceparent" not in dict(p.headers()) for p in parts)


def test_a_batch_joined_to_others_keeps_each_parts_trace_and_only_a_bad_list_is_dropped() -> None:
    class Count:
        def inc(self, amount: int = 1) -> None:
            pass

    traced = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    batch = packed([(b"k1", b"one", 0), (b"k2", b"two", 0)])
    plan = ParkPlan("tier", [(SCHEDULE_HEADER, b"0 1 0 0 hooks")], Count(), False)
    items = [(None, batch, 2), (b"k3", b"three", 0), (None, batch, 2)]
    entries = [
        *trace_entries([(PARTS_TRACE_HEADER, b"- " + traced)], 2),
        *trace_entries([("traceparent", traced)], 0),
        *trace_entries([(PARTS_TRACE_HEADER, traced)], 2),  # one entry for two parts: not ours
    ]
    record = plan.batch(items, entries)
    parts = unpacked(record[2], record[3])
    assert [dict(p.headers()).get("traceparent") for p in parts] == [
        None,
        traced,
        traced,
        None,
        None,
    ]
