"""Unit tests for pipeline.core.durations: human durations such as 10s, 1m, 250ms, 4h."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.core.durations import format_duration, parse_duration, parse_duration_list


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("1ms", 0.001),
        ("10s", 10.0),
        ("1m", 60.0),
        ("5m", 300.0),
        ("30m", 1800.0),
        ("1h", 3600.0),
        ("4h", 14400.0),
        ("1d", 86400.0),
        ("1.5h", 5400.0),
        ("0.5s", 0.5),
        ("7", 7.0),  # a bare number means seconds
        ("2.5", 2.5),
        (" 10s ", 10.0),
        ("10 s", 10.0),
    ],
)
def test_parse_duration_units(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)
    assert isinstance(parse_duration(text), float)


@pytest.mark.parametrize(
    "text",
    ["", " ", "s", "ten", "10x", "10sec", "-1s", "1e3", "10S", "1h30m", "inf", "nan", "1..5s"],
)
def test_parse_duration_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["0", "0s", "0ms", "0.0h"])
def test_parse_duration_rejects_zero(text: str) -> None:
    with pytest.raises(ValueError, match="greater than zero"):
        parse_duration(text)


def test_parse_duration_error_names_the_setting_and_the_value() -> None:
    with pytest.raises(ValueError) as info:
        parse_duration("soon", name="PIPELINE_DELIVERY_TIMEOUT")
    message = str(info.value)
    assert message.startswith("PIPELINE_DELIVERY_TIMEOUT:")
    assert "'soon'" in message


def test_parse_duration_list() -> None:
    assert parse_duration_list("10s,1m,5m,30m,1h") == (10.0, 60.0, 300.0, 1800.0, 3600.0)
    assert parse_duration_list("1s") == (1.0,)
    assert parse_duration_list(" 1s , 2s ") == (1.0, 2.0)
    # empty entries (a trailing comma, a doubled comma) are skipped
    assert parse_duration_list("1s,,2s,") == (1.0, 2.0)


@pytest.mark.parametrize("text", ["", ",", " , ,"])
def test_parse_duration_list_needs_one_entry(text: str) -> None:
    with pytest.raises(ValueError, match="PIPELINE_RETRY_DELAYS: empty list"):
        parse_duration_list(text, name="PIPELINE_RETRY_DELAYS")


def test_parse_duration_list_bad_entry_names_the_setting() -> None:
    with pytest.raises(ValueError, match=r"^PIPELINE_RETRY_DELAYS: 'soon' is not a duration"):
        parse_duration_list("10s,soon", name="PIPELINE_RETRY_DELAYS")
    with pytest.raises(ValueError, match="PIPELINE_RETRY_DELAYS"):
        parse_duration_list("10s,0s", name="PIPELINE_RETRY_DELAYS")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (86400.0, "1d"),
        (172800.0, "2d"),
        (3600.0, "1h"),
        (14400.0, "4h"),
        (90000.0, "25h"),
        (60.0, "1m"),
        (90.0, "90s"),
        (1800.0, "30m"),
        (1.0, "1s"),
        (10.0, "10s"),
        (0.25, "250ms"),
        (1.5, "1500ms"),
        (0.001, "1ms"),
    ],
)
def test_format_duration_shortest_exact_form(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.integers(min_value=1, max_value=10**9))
def test_format_then_parse_round_trips_whole_milliseconds(millis: int) -> None:
    seconds = millis / 1000
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, rel=1e-12)
