"""The delivery log's records: what the pipeline decided about a call, and when.

One Kafka record on ``deliveries.log`` (``LogRecord`` in log_record.avsc) carries the entries of
one hand-off for one call: the router's ``received`` and ``routed`` (or ``dropped``), the delivery
handler's ``attempt`` and its conclusion (``delivered``, ``retry_scheduled`` or
``dead_lettered``). It is keyed by ``messageId``, so a call's entries keep their order.

The builders (``routed_record``, ``attempt_record``, ...) return the codec's dict directly: they
run once per call and per attempt on the hot path. The store reads records back as ``LogRecord``
(``log_record_from_avro``) and folds each entry into the call's state per destination
(``state_after``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.core.calls import Call
from pipeline.core.outcomes import Failure, Outcome, UrlResult
from pipeline.core.records import Delivery

__all__ = [
    "LogKind",
    "JourneyState",
    "LogEntry",
    "LogRecord",
    "RESPONSE_SNIPPET_BYTES",
    "call_log_record",
    "conclusion_log_record",
    "entry",
    "log_record",
    "log_record_from_avro",
    "state_after",
]

#: How much of a failed attempt's response body the log keeps.
RESPONSE_SNIPPET_BYTES = 1024

Record = dict[str, Any]


class LogKind(enum.StrEnum):
    RECEIVED = "received"
    """The router read the call (source, type, ids, size)."""
    ROUTED = "routed"
    """The call goes to ``destinations`` (one entry, every destination)."""
    DROPPED = "dropped"
    """The call goes nowhere (no ``destination``), or not to ``destination``; ``reason`` says why."""
    ATTEMPT = "attempt"
    """One webhook's answer to one attempt: ``url``, ``status`` or ``error``, ``duration_ms``."""
    DELIVERED = "delivered"
    RETRY_SCHEDULED = "retry_scheduled"
    """The next attempt waits in tier ``tier`` until ``not_before``."""
    DEAD_LETTERED = "dead_lettered"
    REPLAYED = "replayed"
    """A dead letter (or a range of calls) was sent again; ``replay_id`` names the replay."""
    SUPPRESSED = "suppressed"
    """Not delivered: a deletion request for the user came first."""


class JourneyState(enum.StrEnum):
    """Where a call stands for one destination (``pipeline log --state``)."""

    ROUTED = "routed"
    """Routed, no attempt concluded yet (in flight)."""
    DELIVERED = "delivered"
    WAITING = "waiting"
    """In a retry tier until ``not_before``."""
    DEAD_LETTERED = "dead_lettered"
    DROPPED = "dropped"
    SUPPRESSED = "suppressed"


_STATE_AFTER: dict[LogKind, JourneyState | None] = {
    LogKind.RECEIVED: None,
    LogKind.ROUTED: JourneyState.ROUTED,
    LogKind.DROPPED: JourneyState.DROPPED,
    LogKind.ATTEMPT: None,  # its conclusion, in the same record, says what follows
    LogKind.DELIVERED: JourneyState.DELIVERED,
    LogKind.RETRY_SCHEDULED: JourneyState.WAITING,
    LogKind.DEAD_LETTERED: JourneyState.DEAD_LETTERED,
    LogKind.REPLAYED: JourneyState.ROUTED,
    LogKind.SUPPRESSED: JourneyState.SUPPRESSED,
}


def state_after(kind: LogKind) -> JourneyState | None:
    """The state an entry of ``kind`` leaves its destination in; ``None``: unchanged."""
    return _STATE_AFTER[kind]


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One decision about a call (``LogEntry`` in log_record.avsc). Times are epoch ms."""

    kind: LogKind
    at: int
    destination: str = ""
    """The destination it concerns; empty for the call as a whole (received, routed, dropped)."""
    destinations: tuple[str, ...] = ()
    """``routed``: every destination the call goes to."""
    reason: str = ""
    """``dropped`` and ``dead_lettered``: why."""
    size: int = 0
    """``received``: the call's size in bytes."""
    url: str = ""
    status: int | None = None
    """``attempt``: the HTTP status, or ``None`` when no answer came (see ``error``)."""
    error: str = ""
    """``attempt``: the failure's class (``timeout``, ``connection``, ``http_500``, ...)."""
    duration_ms: int = 0
    tier: int = -1
    """``attempt``: the tier it was made from (-1: first); ``retry_scheduled``: the next tier."""
    not_before: int = 0
    """``retry_scheduled``: when the next attempt is due."""
    attempt: int = 0
    """``attempt``: its number for this destination, from 1."""
    response: str = ""
    """``attempt`` that failed: the first ``RESPONSE_SNIPPET_BYTES`` of the answer's body."""
    replay_id: str = ""
    body: str | None = None
    """``received``: the call's JSON, only with ``PIPELINE_LOG_BODIES=true`` (personal data)."""


@dataclass(frozen=True, slots=True)
class LogRecord:
    """The entries of one hand-off for one call, with what identifies the call."""

    message_id: str
    source: str
    call_type: str
    user_id: str | None
    anonymous_id: str | None
    event: str | None
    """A track call's event name."""
    entries: tuple[LogEntry, ...]


#: Every field of an entry with its default: the compiled Avro writer takes only whole records
#: (a record missing a field falls back to fastavro, several times slower).
_ENTRY_DEFAULTS: Record = {
    "destination": "",
    "destinations": [],
    "reason": "",
    "size": 0,
    "url": "",
    "status": None,
    "error": "",
    "durationMs": 0,
    "tier": -1,
    "notBefore": 0,
    "attempt": 0,
    "response": "",
    "replayId": "",
    "body": None,
}


def entry(kind: LogKind, at: int, **fields: Any) -> Record:
    """One entry as the codec's dict; ``fields`` by their Avro names (``notBefore``, ...)."""
    return {**_ENTRY_DEFAULTS, "kind": kind.value, "at": at, **fields}


def log_record(
    message_id: str,
    source: str,
    call_type: str,
    entries: Sequence[Record],
    *,
    user_id: str | None = None,
    anonymous_id: str | None = None,
    event: str | None = None,
) -> Record:
    """A ``LogRecord`` as the codec's dict."""
    return {
        "messageId": message_id,
        "sourceId": source,
        "callType": call_type,
        "userId": user_id,
        "anonymousId": anonymous_id,
        "event": event,
        "entries": list(entries),
    }


def call_log_record(
    call: Call,
    size: int,
    at: int,
    *,
    destinations: Sequence[str] = (),
    dropped: str | None = None,
    excluded: Sequence[tuple[str, str]] = (),
    body: str | None = None,
) -> Record:
    """The router's record for one call: ``received``, then ``routed`` to ``destinations`` or
    ``dropped`` for ``dropped``, and a ``dropped`` per connected destination left out."""
    entries = [entry(LogKind.RECEIVED, call.received_at, size=size, body=body)]
    if dropped is None:
        entries.append(entry(LogKind.ROUTED, at, destinations=list(destinations)))
    else:
        entries.append(entry(LogKind.DROPPED, at, reason=dropped))
    for destination, reason in excluded:
        entries.append(entry(LogKind.DROPPED, at, destination=destination, reason=reason))
    return log_record(
        call.message_id,
        call.source_id,
        call.type.value,
        entries,
        user_id=call.user_id,
        anonymous_id=call.anonymous_id,
        event=call.event,
    )


def conclusion_log_record(
    before: Delivery,
    outcome: Outcome,
    after: Delivery,
    finished: float,
    *,
    results: Sequence[UrlResult] = (),
    started: float = 0.0,
    reason: str = "",
) -> Record:
    """The delivery handler's record for one delivery: an ``attempt`` per webhook that was
    requested (``results``, from ``started``), then the conclusion reached at ``finished``
    (epoch seconds). ``before`` is the delivery as it was attempted, ``after`` as it is handed on."""
    destination = before.destination_id
    entries = []
    if results:
        number = len({attempt.at for attempt in before.attempts}) + 1
        at = int(started * 1000)
        for result in results:
            failure = result.failure
            if failure is Failure.CIRCUIT_OPEN:
                continue  # not requested
            entries.append(
                entry(
                    LogKind.ATTEMPT,
                    at,
                    destination=destination,
                    url=result.url,
                    status=result.status,
                    error="" if failure is None else failure.value,
                    durationMs=int(result.duration * 1000),
                    tier=before.tier,
                    attempt=number,
                    response=result.response,
                )
            )
    done = int(finished * 1000)
    if outcome is Outcome.DELIVERED:
        entries.append(entry(LogKind.DELIVERED, done, destination=destination))
    elif outcome is Outcome.RETRY:
        entries.append(
            entry(
                LogKind.RETRY_SCHEDULED,
                done,
                destination=destination,
                tier=after.tier,
                notBefore=after.not_before,
                reason=reason,
            )
        )
    else:
        entries.append(entry(LogKind.DEAD_LETTERED, done, destination=destination, reason=reason))
    return log_record(before.message_id, before.source_id, before.call_type, entries)


def _entry_from_avro(record: Record) -> LogEntry:
    return LogEntry(
        kind=LogKind(record["kind"]),
        at=record["at"],
        destination=record["destination"],
        destinations=tuple(record["destinations"]),
        reason=record["reason"],
        size=record["size"],
        url=record["url"],
        status=record["status"],
        error=record["error"],
        duration_ms=record["durationMs"],
        tier=record["tier"],
        not_before=record["notBefore"],
        attempt=record["attempt"],
        response=record["response"],
        replay_id=record["replayId"],
        body=record["body"],
    )


def log_record_from_avro(record: Record) -> LogRecord:
    """A decoded ``LogRecord`` (the codec's dict, every default filled in) as typed entries.

    Raises ``ValueError`` on an entry kind this version does not know."""
    return LogRecord(
        message_id=record["messageId"],
        source=record["sourceId"],
        call_type=record["callType"],
        user_id=record["userId"],
        anonymous_id=record["anonymousId"],
        event=record["event"],
        entries=tuple(_entry_from_avro(e) for e in record["entries"]),
    )
