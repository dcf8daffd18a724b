"""Unit tests for pipeline.core.timestamps: ISO 8601 in, YYYY-MM-DDTHH:MM:SS.mmmZ out."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.timestamps import format_timestamp, now_ms, parse_timestamp


def ms(dt: datetime) -> int:
    """Epoch milliseconds computed independently of the module under test."""
    delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
    return delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000


BASE = ms(datetime(2026, 11, 21, 7, 4, 30, 123_000, tzinfo=UTC))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-21T07:04:30.123Z", BASE),
        ("2026-11-21T07:04:30.123z", BASE),
        ("2026-11-21T07:04:30.123+00:00", BASE),
        ("2026-11-21T07:04:30.123+0000", BASE),
        ("2026-11-21T07:04:30.123-00:00", BASE),
        ("2026-11-21T07:04:30.123", BASE),  # no offset: UTC
        ("2026-11-21 07:04:30.123Z", BASE),  # space separator
        ("2026-11-21T07:04:30,123Z", BASE),  # comma fraction
        ("  2026-11-21T07:04:30.123Z  ", BASE),
        ("2026-11-21T07:04:30Z", BASE - 123),  # no fraction
        ("2026-11-21T07:04:30", BASE - 123),
        ("2026-11-21T07:04Z", BASE - 30_123),  # no seconds
        ("2026-11-21T07:04:30.1Z", BASE - 23),
        ("2026-11-21T07:04:30.12Z", BASE - 3),
        ("2026-11-21T07:04:30.123456Z", BASE),  # sub-millisecond digits are dropped
        ("2026-11-21T07:04:30.123999999Z", BASE),
        # the Go v2 library's form: -0800 without a colon
        ("2026-11-20T23:04:30.123-0800", BASE),
        ("2026-11-20T23:04:30.123-08:00", BASE),
        ("2026-11-20T23:04:30.123-08", BASE),
        ("2026-11-21T12:34:30.123+05:30", BASE),
        ("2026-11-21T12:34:30.123+0530", BASE),
        ("2026-11-21T08:04:30.123+01", BASE),
    ],
)
def test_parse_timestamp_spellings(text: str, expected: int) -> None:
    assert parse_timestamp(text) == expected


def test_go_offset_form_matches_datetime() -> None:
    # -0800: 07:04:30.123 local is 15:04:30.123 UTC
    expected = ms(datetime(2026, 11, 21, 15, 4, 30, 123_000, tzinfo=UTC))
    assert parse_timestamp("2026-11-21T07:04:30.123-0800") == expected
    assert format_timestamp(expected) == "2026-11-21T15:04:30.123Z"


def test_parse_timestamp_before_the_epoch() -> None:
    assert parse_timestamp("1970-01-01T00:00:00Z") == 0
    assert parse_timestamp("1969-12-31T23:59:59.999Z") == -1
    assert parse_timestamp("1969-12-31T23:59:59Z") == -1000


@pytest.mark.parametrize(
    "text",
    [
        "",
        "yesterday",
        "2026-11-21",  # a date is not a date-time
        "2026/11/21T07:04:30Z",
        "2026-11-21T7:04:30Z",
        "2026-11-21T07:04:30.Z",
        "2026-11-21T07:04:30.123ZZ",
        "2026-11-21T07:04:30.123 UTC",
        "2026-11-21T07:04:30.123+8",
        "2026-11-21T07:04:30.123+08:0",
        "2026-13-01T00:00:00Z",  # month 13
        "2026-02-30T00:00:00Z",
        "2026-11-21T24:00:00Z",
        "2026-11-21T07:60:00Z",
        "2026-11-21T07:04:60Z",
        "2026-11-21T07:04:30+24:00",
        "2026-11-21T07:04:30+05:60",
        "1795273470123",
    ],
)
def test_parse_timestamp_rejects_bad_input_naming_the_value(text: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_timestamp(text)
    assert repr(text) in str(info.value)


@given(st.text(max_size=40))
def test_parse_timestamp_only_raises_value_error(text: str) -> None:
    try:
        result = parse_timestamp(text)
    except ValueError as exc:
        assert repr(text) in str(exc)
    else:
        assert isinstance(result, int)


@pytest.mark.parametrize(
    ("millis", "text"),
    [
        (0, "1970-01-01T00:00:00.000Z"),
        (1, "1970-01-01T00:00:00.001Z"),
        (999, "1970-01-01T00:00:00.999Z"),
        (1000, "1970-01-01T00:00:01.000Z"),
        (BASE, "2026-11-21T07:04:30.123Z"),
        (BASE - 123, "2026-11-21T07:04:30.000Z"),
        (-1, "1969-12-31T23:59:59.999Z"),
        (ms(datetime(2028, 2, 29, 23, 59, 59, 999_000, tzinfo=UTC)), "2028-02-29T23:59:59.999Z"),
    ],
)
def test_format_timestamp(millis: int, text: str) -> None:
    assert format_timestamp(millis) == text


FORMAT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


@given(
    st.datetimes(
        min_value=datetime(1971, 1, 1),
        max_value=datetime(9998, 12, 31),
        timezones=st.just(UTC),
    ),
    st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59),
)
def test_any_offset_round_trips(moment: datetime, offset_minutes: int) -> None:
    moment = moment.replace(microsecond=moment.microsecond // 1000 * 1000)
    local = moment.astimezone(timezone(timedelta(minutes=offset_minutes)))
    sign = "-" if offset_minutes < 0 else "+"
    hours, minutes = divmod(abs(offset_minutes), 60)
    base = local.strftime("%Y-%m-%dT%H:%M:%S") + f".{local.microsecond // 1000:03d}"
    for tz in (f"{sign}{hours:02d}{minutes:02d}", f"{sign}{hours:02d}:{minutes:02d}"):
        assert parse_timestamp(base + tz) == ms(moment)
    formatted = format_timestamp(ms(moment))
    assert FORMAT.match(formatted)
    assert formatted == moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{moment.microsecond // 1000:03d}Z"
    assert parse_timestamp(formatted) == ms(moment)


def test_now_ms_is_epoch_milliseconds() -> None:
    before = ms(datetime.now(UTC))
    value = now_ms()
    after = ms(datetime.now(UTC))
    assert isinstance(value, int)
    assert before - 1 <= value <= after + 1
