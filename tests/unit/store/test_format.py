"""The CLI's text for trace, log and stats: pure functions of query results. Values from outside
never reach the terminal raw."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.core.log_entries import JourneyState, LogEntry, LogKind
from pipeline.store import DestinationStats, Journey, Trace
from pipeline.store.format import describe_state, format_log, format_stats, format_trace, safe

T0 = 1_795_003_200_000  # 2026-11-18T12:00:00.000Z
HOSTILE = "evil\x1b[2J\x1b]0;owned\x07\r\nFAKE LINE\u202e\u2028\x00\ud800\x9b"


def journey(**fields: object) -> Journey:
    values: dict[str, object] = dict(
        message_id="m1",
        destination="crm",
        state=JourneyState.DELIVERED,
        source="web",
        call_type="track",
        user_id="u1",
        anonymous_id=None,
        event="Order Completed",
        first_seen=T0,
        last_updated=T0 + 1001,
        attempts=1,
        failed_attempts=0,
        last_status=200,
        last_error=None,
        reason=None,
        tier=None,
        not_before=None,
        replay_id=None,
    )
    values.update(fields)
    return Journey(**values)  # type: ignore[arg-type]


def stats(**fields: object) -> DestinationStats:
    values: dict[str, object] = dict(
        destination="crm",
        attempts=4,
        delivered=1,
        failed=3,
        success_ratio=0.25,
        p50_ms=200,
        p95_ms=400,
        last_error="server_error",
        last_error_status=502,
        last_error_at=T0,
        waiting=1,
        dead_lettered=1,
    )
    values.update(fields)
    return DestinationStats(**values)  # type: ignore[arg-type]


def harmless(text: str) -> bool:
    """Every line printable: no escape sequence, no carriage return, no invisible reordering."""
    return all(line.isprintable() for line in text.split("\n"))


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        ({"state": JourneyState.DELIVERED}, "delivered"),
        ({"state": JourneyState.ROUTED}, "routed"),
        ({"state": JourneyState.SUPPRESSED}, "suppressed"),
        (
            {"state": JourneyState.WAITING, "tier": 1, "not_before": T0 + 60_000},
            "waiting (tier 1 until 2026-11-18T12:01:00.000Z)",
        ),
        (
            {"state": JourneyState.DEAD_LETTERED, "reason": "client_error"},
            "dead_lettered (client_error)",
        ),
        ({"state": JourneyState.DROPPED, "reason": "no_route"}, "dropped (no_route)"),
        ({"state": JourneyState.DROPPED}, "dropped"),
    ],
)
def test_each_state_is_described(fields: dict[str, object], shown: str):
    assert describe_state(journey(**fields)) == shown


def test_a_trace_reads_as_a_journey():
    trace = Trace(
        message_id="m1",
        source="web",
        call_type="track",
        user_id="u1",
        anonymous_id="a1",
        event="Order Completed",
        entries=(
            LogEntry(LogKind.RECEIVED, T0, size=2048),
            LogEntry(LogKind.ROUTED, T0 + 1, destinations=("crm", "wh")),
            LogEntry(
                LogKind.ATTEMPT,
                T0 + 1000,
                destination="crm",
                url="https://crm.example/hook",
                status=503,
                error="server_error",
                duration_ms=120,
                attempt=1,
                response="try later",
            ),
            LogEntry(
                LogKind.RETRY_SCHEDULED, T0 + 1001, destination="crm", tier=0, not_before=T0 + 11001
            ),
            LogEntry(
                LogKind.ATTEMPT, T0 + 1000, destination="wh", status=200, duration_ms=8, attempt=1
            ),
            LogEntry(LogKind.DELIVERED, T0 + 1001, destination="wh"),
        ),
        destinations=(
            journey(
                state=JourneyState.WAITING,
                tier=0,
                not_before=T0 + 11001,
                failed_attempts=1,
                last_status=503,
                last_error="server_error",
            ),
            journey(destination="wh"),
        ),
    )
    text = format_trace(trace)
    lines = text.split("\n")
    assert lines[0] == "message m1: track 'Order Completed' from web, user u1, anonymous a1"
    assert lines[1].split() == ["2026-11-18T12:00:00.000Z", "received", "-", "2,048", "bytes"]
    assert "→ crm, wh" in lines[2]
    assert lines[3].split() == [
        "2026-11-18T12:00:01.000Z",
        "attempt",
        "crm",
        "#1",
        "HTTP",
        "503",
        "server_error",
        "120",
        "ms",
        "https://crm.example/hook",
        "response",
        "try",
        "later",
    ]
    assert "tier 0 until 2026-11-18T12:00:11.001Z" in lines[4]
    assert lines[7] == "state:"
    assert lines[8] == (
        "  crm  waiting (tier 0 until 2026-11-18T12:00:11.001Z), 1 attempt (1 failed), "
        "last HTTP 503 server_error"
    )
    assert lines[9] == "  wh   delivered, 1 attempt, last HTTP 200"


def test_an_attempt_names_the_batch_that_carried_it():
    entry = LogEntry(
        LogKind.ATTEMPT,
        T0,
        destination="wh",
        status=200,
        duration_ms=8,
        attempt=1,
        reason="batch_0a1b of 3 calls",
    )
    trace = Trace("m1", "web", "track", None, None, None, (entry,), ())
    line = format_trace(trace).split("\n")[1]
    assert line.endswith("8 ms  in batch_0a1b of 3 calls")
    assert "reason" not in line


def test_a_purged_call_says_so():
    trace = Trace("m1", None, None, None, None, None, (), (), purged_at=T0)
    assert format_trace(trace) == (
        "message m1: removed by a deletion request for its user at 2026-11-18T12:00:00.000Z"
    )


def test_a_call_dropped_as_a_whole():
    trace = Trace(
        "m1",
        "web",
        "alias",
        "u1",
        None,
        None,
        (LogEntry(LogKind.RECEIVED, T0), LogEntry(LogKind.DROPPED, T0 + 1, reason="no_route")),
        (journey(destination="", state=JourneyState.DROPPED, reason="no_route", attempts=0),),
    )
    text = format_trace(trace)
    assert "reason no_route" in text.split("\n")[2]
    assert text.endswith("  (call)  dropped (no_route)")


def test_log_lines():
    rows = [
        journey(),
        journey(
            message_id="m2",
            destination="wh",
            state=JourneyState.WAITING,
            user_id=None,
            anonymous_id="a2",
            attempts=12,
            last_status=None,
            last_error="timeout",
        ),
        journey(message_id="m3", state=JourneyState.ROUTED, attempts=0, last_status=None),
    ]
    lines = format_log(rows).split("\n")
    assert lines[0].split() == [
        "LAST",
        "UPDATED",
        "STATE",
        "DESTINATION",
        "TYPE",
        "SOURCE",
        "USER",
        "MESSAGE",
        "ID",
        "ATTEMPTS",
        "LAST",
        "STATUS",
    ]
    assert lines[1].split() == [
        "2026-11-18T12:00:01.001Z",
        "delivered",
        "crm",
        "track",
        "web",
        "u1",
        "m1",
        "1",
        "HTTP",
        "200",
    ]
    assert lines[2].split()[1:] == ["waiting", "wh", "track", "web", "a2", "m2", "12", "timeout"]
    assert lines[3].split()[-2:] == ["0", "-"]
    assert format_log([]) == "no calls match"


def test_stats_table():
    rows = [
        stats(),
        stats(
            destination="good",
            attempts=1000,
            failed=0,
            success_ratio=1.0,
            last_error=None,
            last_error_status=None,
            last_error_at=None,
            waiting=0,
            dead_lettered=0,
        ),
    ]
    lines = format_stats(rows).split("\n")
    assert lines[0].split() == [
        "DESTINATION",
        "ATTEMPTS",
        "DELIVERED",
        "FAILED",
        "SUCCESS",
        "P50",
        "MS",
        "P95",
        "MS",
        "WAITING",
        "DEAD",
        "LAST",
        "ERROR",
    ]
    assert lines[1].split() == [
        "crm",
        "4",
        "1",
        "3",
        "25.0%",
        "200",
        "400",
        "1",
        "1",
        "HTTP",
        "502",
        "server_error",
        "at",
        "2026-11-18T12:00:00.000Z",
    ]
    assert lines[2].split() == ["good", "1,000", "1", "0", "100.0%", "200", "400", "0", "0", "-"]
    idle = stats(attempts=0, success_ratio=None, p50_ms=None, p95_ms=None, last_error_at=None)
    assert format_stats([idle]).split("\n")[1].split()[4:7] == ["-", "-", "-"]
    assert format_stats([]).startswith("no attempts")


def test_hostile_values_are_rendered_harmless():
    hostile_journey = journey(
        message_id=HOSTILE,
        destination=HOSTILE,
        source=HOSTILE,
        call_type=HOSTILE,
        user_id=HOSTILE,
        event=HOSTILE,
        state=JourneyState.DEAD_LETTERED,
        reason=HOSTILE,
        last_error=HOSTILE,
        replay_id=HOSTILE,
    )
    trace = Trace(
        HOSTILE,
        HOSTILE,
        HOSTILE,
        HOSTILE,
        HOSTILE,
        HOSTILE,
        (
            LogEntry(LogKind.ROUTED, T0, destinations=(HOSTILE,)),
            LogEntry(
                LogKind.ATTEMPT,
                T0,
                destination=HOSTILE,
                url=HOSTILE,
                error=HOSTILE,
                response=HOSTILE * 100,
                reason=HOSTILE,
                replay_id=HOSTILE,
            ),
        ),
        (hostile_journey,),
    )
    outputs = [
        format_trace(trace),
        format_log([hostile_journey]),
        format_stats([stats(destination=HOSTILE, last_error=HOSTILE)]),
    ]
    for text in outputs:
        assert harmless(text), text
        assert (
            "\x1b" not in text and "\r" not in text and "FAKE LINE" not in text.split("\n")[0][:9]
        )
        assert "evil\\x1b[2J" in text
    assert len(format_trace(trace).split("\n")) == 5  # header, 2 entries, "state:", 1 journey
    assert len(outputs[1].split("\n")) == 2


def test_safe():
    assert safe("plain text, ünïcödé 💥") == "plain text, ünïcödé 💥"
    assert safe("a\nb\tc\x00") == "a\\nb\\tc\\x00"
    assert safe("\u202eabc") == "\\u202eabc"
    assert safe("x" * 200) == "x" * 120 + "…"
    assert safe(None) == ""
    assert safe(replace(journey(), user_id="u").user_id) == "u"


def test_a_traced_call_shows_its_trace_id_and_its_link_when_there_is_a_template():
    tid = "4bf92f3577b34da6a3ce929d0e0e4736"
    trace = Trace(
        "m1", "web", "track", None, None, None, (LogEntry(LogKind.RECEIVED, T0, trace_id=tid),), ()
    )
    assert trace.trace_id == tid and trace.as_json()["trace_id"] == tid
    assert format_trace(trace).split("\n")[1] == f"trace {tid}"
    template = "https://tempo.example/explore?trace={trace_id}&x=1"
    assert format_trace(trace, template).split("\n")[1] == (
        f"trace {tid}  https://tempo.example/explore?trace={tid}&x=1"
    )
    untraced = Trace("m1", "web", "track", None, None, None, (LogEntry(LogKind.RECEIVED, T0),), ())
    assert untraced.trace_id is None and "trace" not in format_trace(untraced, template)
