"""Parked batches: the value of a record carrying many parked records, read back exactly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.roles.parking import PARTS_HEADER, entry_size, packed, unpacked

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
