"""``pipeline.core.log_entries``: the delivery log's records, as the router and the delivery handler
build them, read back as typed entries; and the compiled Avro writer's fast path for them."""

from __future__ import annotations

import pytest

from pipeline import parse_call
from pipeline.core.log_entries import (
    JourneyState,
    LogKind,
    call_log_record,
    conclusion_log_record,
    log_record_from_avro,
    state_after,
)
from pipeline.core.outcomes import Failure, Outcome, UrlResult
from pipeline.core.records import Attempt, Delivery
from pipeline.kafka.codec import Codec

CODEC = Codec.default()
CALL = parse_call(
    {"type": "track", "event": "Order", "userId": "u1", "anonymousId": "a1", "messageId": "m1"},
    source_id="web",
    received_at=1_000,
)
DELIVERY = Delivery("m1", "hooks", "web", "track", b"{}", 1_000)


def round_trip(record: dict[str, object]) -> object:
    write = CODEC._compiled["LogRecord"]
    assert write is not None
    write(bytearray(), record)  # raises on anything the fast path does not expect
    return log_record_from_avro(CODEC.decode("LogRecord", CODEC.encode("LogRecord", record)))


def test_the_routers_record_of_a_routed_call() -> None:
    record = round_trip(
        call_log_record(
            CALL,
            321,
            2_000,
            destinations=["a", "b"],
            excluded=[("c", "destination_disabled")],
            body='{"x":1}',
        )
    )
    assert (record.message_id, record.source, record.call_type) == ("m1", "web", "track")  # type: ignore[attr-defined]
    assert (record.user_id, record.anonymous_id, record.event) == ("u1", "a1", "Order")  # type: ignore[attr-defined]
    received, routed, dropped = record.entries  # type: ignore[attr-defined]
    assert (received.kind, received.at, received.size, received.body) == (
        LogKind.RECEIVED,
        1_000,
        321,
        '{"x":1}',
    )
    assert (routed.kind, routed.at, routed.destinations) == (LogKind.ROUTED, 2_000, ("a", "b"))
    assert (dropped.kind, dropped.destination, dropped.reason) == (
        LogKind.DROPPED,
        "c",
        "destination_disabled",
    )


def test_the_routers_record_of_a_dropped_call() -> None:
    record = round_trip(call_log_record(CALL, 10, 2_000, dropped="blocked_event"))
    assert [(e.kind, e.destination, e.reason) for e in record.entries] == [  # type: ignore[attr-defined]
        (LogKind.RECEIVED, "", ""),
        (LogKind.DROPPED, "", "blocked_event"),
    ]


def test_an_attempt_and_its_conclusion() -> None:
    earlier = DELIVERY._replace(tier=0, attempts=(Attempt(5, "u", 503, "x", 1),))
    results = [
        UrlResult("https://a/h", 503, Failure.SERVER_ERROR, "busy", 0.25, response="busy" * 10),
        UrlResult("https://b/h", None, Failure.TIMEOUT, "no answer", 1.0),
        UrlResult("https://c/h", failure=Failure.CIRCUIT_OPEN),  # not requested: not logged
    ]
    after = earlier._replace(tier=1, not_before=9_000)
    record = round_trip(
        conclusion_log_record(earlier, Outcome.RETRY, after, 3.5, results=results, started=2.0)
    )
    a, b, scheduled = record.entries  # type: ignore[attr-defined]
    assert (a.kind, a.at, a.url, a.status, a.error, a.duration_ms, a.tier, a.attempt) == (
        LogKind.ATTEMPT,
        2_000,
        "https://a/h",
        503,
        "server_error",
        250,
        0,
        2,
    )
    assert a.response == "busy" * 10 and b.response == ""
    assert (b.status, b.error) == (None, "timeout")
    assert (scheduled.kind, scheduled.at, scheduled.tier, scheduled.not_before) == (
        LogKind.RETRY_SCHEDULED,
        3_500,
        1,
        9_000,
    )


@pytest.mark.parametrize(
    ("outcome", "reason", "kind"),
    [
        (Outcome.DELIVERED, "", LogKind.DELIVERED),
        (Outcome.DEAD_LETTER, "client_error", LogKind.DEAD_LETTERED),
    ],
)
def test_a_conclusion_without_a_request(outcome: Outcome, reason: str, kind: LogKind) -> None:
    record = round_trip(conclusion_log_record(DELIVERY, outcome, DELIVERY, 1.0, reason=reason))
    [only] = record.entries  # type: ignore[attr-defined]
    assert (only.kind, only.destination, only.reason) == (kind, "hooks", reason)


def test_every_kind_has_a_state_after_it() -> None:
    assert state_after(LogKind.DELIVERED) is JourneyState.DELIVERED
    assert state_after(LogKind.RETRY_SCHEDULED) is JourneyState.WAITING
    assert state_after(LogKind.ATTEMPT) is None and state_after(LogKind.RECEIVED) is None
    assert state_after(LogKind.HELD) is JourneyState.HELD
    # A released call stands where its outcome left it.
    assert state_after(LogKind.RELEASED) is None
    assert {k for k in LogKind if state_after(k) is not None} == set(LogKind) - {
        LogKind.ATTEMPT,
        LogKind.RECEIVED,
        LogKind.RELEASED,
    }


def test_an_unknown_kind_is_refused() -> None:
    record = CODEC.decode("LogRecord", CODEC.encode("LogRecord", call_log_record(CALL, 1, 1)))
    record["entries"][0]["kind"] = "teleported"
    with pytest.raises(ValueError, match="teleported"):
        log_record_from_avro(record)
