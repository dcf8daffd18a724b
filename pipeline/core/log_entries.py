"""The delivery log's records: what the pipeline decided about a call, and when.

A ``LogRecord`` (log_record.avsc) carries the entries of one hand-off for one call: the router's
``received`` and ``routed`` (or ``dropped``), the delivery handler's ``attempt`` and its conclusion
(``delivered``, ``retry_scheduled`` or ``dead_lettered``). The records of one hand-off batch travel
as one Kafka record on ``deliveries.log``, a ``LogBatch`` (log_batch.avsc; ``log_batches`` cuts a
large batch in pieces): the log costs a Kafka record per batch, not per call. A call's records may
reach the store in any order (the router's and the delivery handler's batches go to different
partitions); the store folds them by time, whatever the order.

The builders (``call_log_record``, ``conclusion_log_record``) return the codec's dict directly: they
run once per call and per attempt on the hot path. The store reads records back as ``LogRecord``
(``log_record_from_avro``) and folds each entry into the call's state per destination
(``state_after``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, NamedTuple

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
    "suppressed_log_record",
    "held_log_record",
    "released_log_record",
    "entry",
    "LOG_BATCH_BYTES",
    "log_batch",
    "log_record",
    "log_record_from_avro",
    "log_records_from_avro",
    "state_after",
]

#: How much of a failed attempt's response body the log keeps.
RESPONSE_SNIPPET_BYTES = 1024
#: A ``LogBatch`` larger than this is cut in halves (``pipeline.kafka.log_batches``), well under
#: Kafka's default 1 MB record limit whatever the bodies and answers logged.
LOG_BATCH_BYTES = 512 * 1024

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
    HELD = "held"
    """Waits behind an earlier call of the same user to an ordered destination (``reason``: that
    call's messageId) until it has an outcome."""
    RELEASED = "released"
    """An ordered destination's call that held its user back has an outcome; ``reason`` says which
    and names the calls that then went on (past it, when it was dead-lettered)."""


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
    HELD = "held"
    """Held behind an earlier call of its user (``reason``: its messageId)."""


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
    LogKind.HELD: JourneyState.HELD,
    LogKind.RELEASED: None,
}


def state_after(kind: LogKind) -> JourneyState | None:
    """The state an entry of ``kind`` leaves its destination in; ``None``: unchanged."""
    return _STATE_AFTER[kind]


class LogEntry(NamedTuple):
    """One decision about a call (``LogEntry`` in log_record.avsc). Times are epoch ms.

    A named tuple, not a dataclass: the log-store makes one per entry it reads, and a frozen
    dataclass took three times as long to make (a fifth of the log-store's time)."""

    kind: LogKind
    at: int
    #: The destination it concerns; empty for the call as a whole (received, routed, dropped).
    destination: str = ""
    #: ``routed``: every destination the call goes to.
    destinations: tuple[str, ...] = ()
    #: ``dropped`` and ``dead_lettered``: why.
    reason: str = ""
    #: ``received``: the call's size in bytes.
    size: int = 0
    url: str = ""
    #: ``attempt``: the HTTP status, or ``None`` when no answer came (see ``error``).
    status: int | None = None
    #: ``attempt``: the failure's class (``timeout``, ``connection``, ``http_500``, ...).
    error: str = ""
    duration_ms: int = 0
    #: ``attempt``: the tier it was made from (-1: first); ``retry_scheduled``: the next tier.
    tier: int = -1
    #: ``retry_scheduled``: when the next attempt is due.
    not_before: int = 0
    #: ``attempt``: its number for this destination, from 1.
    attempt: int = 0
    #: ``attempt`` that failed: the first ``RESPONSE_SNIPPET_BYTES`` of the answer's body.
    response: str = ""
    replay_id: str = ""
    #: ``received``: the call's JSON, only with ``PIPELINE_LOG_BODIES=true`` (personal data).
    body: str | None = None
    #: ``received``: the call's trace id (32 hex digits), when it came with a trace context.
    trace_id: str = ""


class LogRecord(NamedTuple):
    """The entries of one hand-off for one call, with what identifies the call."""

    message_id: str
    source: str
    call_type: str
    user_id: str | None
    anonymous_id: str | None
    #: A track call's event name.
    event: str | None
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
    "traceId": "",
}


def entry(kind: LogKind, at: int, **fields: Any) -> Record:
    """One entry as the codec's dict; ``fields`` by their Avro names (``notBefore``, ...)."""
    return {**_ENTRY_DEFAULTS, "kind": kind.value, "at": at, **fields}


#: Per kind, an entry with every field at its default: the hot path copies one and sets what it
#: needs (a third of the time of ``entry``'s keyword arguments).
_BLANK = {kind: entry(kind, 0) for kind in LogKind}


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


def log_batch(records: Sequence[Record]) -> Record:
    """A ``LogBatch`` as the codec's dict."""
    return {"records": list(records)}


def call_log_record(
    call: Call,
    size: int,
    at: int,
    *,
    destinations: Sequence[str] = (),
    dropped: str | None = None,
    detail: str = "",
    excluded: Sequence[tuple[str, str]] = (),
    body: str | None = None,
    trace_id: str = "",
) -> Record:
    """The router's record for one call: ``received``, then ``routed`` to ``destinations`` or
    ``dropped`` for ``dropped`` (``detail``: more words on why, in the entry's ``error``), and a
    ``dropped`` per connected destination left out."""
    received = _BLANK[LogKind.RECEIVED].copy()
    received["at"], received["size"], received["body"] = call.received_at, size, body
    received["traceId"] = trace_id
    entries = [received]
    if dropped is None:
        routed = _BLANK[LogKind.ROUTED].copy()
        routed["at"], routed["destinations"] = at, list(destinations)
        entries.append(routed)
    else:
        entries.append(entry(LogKind.DROPPED, at, reason=dropped, error=detail))
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
    batch: str = "",
) -> Record:
    """The delivery handler's record for one delivery: an ``attempt`` per webhook that was
    requested (``results``, from ``started``), then the conclusion reached at ``finished``
    (epoch seconds). ``before`` is the delivery as it was attempted, ``after`` as it is handed on;
    ``batch``: the batch that carried it (its attempt entries' ``reason``)."""
    destination = before.destination_id
    entries = []
    if results:
        number = len({attempt.at for attempt in before.attempts}) + 1
        at = int(started * 1000)
        for result in results:
            failure = result.failure
            if failure is Failure.CIRCUIT_OPEN:
                continue  # not requested
            attempt = _BLANK[LogKind.ATTEMPT].copy()
            attempt["at"] = at
            attempt["destination"] = destination
            attempt["url"] = result.url
            attempt["status"] = result.status
            if failure is not None:
                attempt["error"] = failure.value
            attempt["durationMs"] = int(result.duration * 1000)
            attempt["tier"] = before.tier
            attempt["attempt"] = number
            attempt["response"] = result.response
            if batch:
                attempt["reason"] = batch
            entries.append(attempt)
    done = int(finished * 1000)
    if outcome is Outcome.DELIVERED:
        delivered = _BLANK[LogKind.DELIVERED].copy()
        delivered["at"], delivered["destination"] = done, destination
        entries.append(delivered)
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


def suppressed_log_record(delivery: Delivery, at: int, reason: str) -> Record:
    """The delivery handler's record for a delivery it suppressed at ``at`` (epoch ms) without
    an attempt: a deletion request for the user came after the call (``reason`` says so)."""
    suppressed = entry(LogKind.SUPPRESSED, at, destination=delivery.destination_id, reason=reason)
    return log_record(delivery.message_id, delivery.source_id, delivery.call_type, [suppressed])


def held_log_record(delivery: Delivery, at: int, blocker: str) -> Record:
    """The delivery handler's record for a delivery held at ``at`` (epoch ms) behind the call
    ``blocker`` of the same user to an ordered destination."""
    held = entry(LogKind.HELD, at, destination=delivery.destination_id, reason=blocker)
    return log_record(delivery.message_id, delivery.source_id, delivery.call_type, [held])


def released_log_record(
    message_id: str, source: str, call_type: str, destination: str, at: int, detail: str
) -> Record:
    """The record for a call that held its user back to an ordered destination and has an
    outcome: ``detail`` says which, and which calls went on then."""
    released = entry(LogKind.RELEASED, at, destination=destination, reason=detail)
    return log_record(message_id, source, call_type, [released])


_KINDS = {kind.value: kind for kind in LogKind}


def _entry_from_avro(record: Record) -> LogEntry:
    kind = _KINDS.get(record["kind"])
    if kind is None:
        raise ValueError(f"{record['kind']!r} is not a log entry kind this version knows")
    return LogEntry(
        kind,
        record["at"],
        record["destination"],
        tuple(record["destinations"]),
        record["reason"],
        record["size"],
        record["url"],
        record["status"],
        record["error"],
        record["durationMs"],
        record["tier"],
        record["notBefore"],
        record["attempt"],
        record["response"],
        record["replayId"],
        record["body"],
        record["traceId"],
    )


def log_records_from_avro(batch: Record) -> list[LogRecord]:
    """A decoded ``LogBatch``'s records (see ``log_record_from_avro``)."""
    return [log_record_from_avro(record) for record in batch["records"]]


def log_record_from_avro(record: Record) -> LogRecord:
    """A decoded ``LogRecord`` (the codec's dict, every default filled in) as typed entries.

    Raises ``ValueError`` on an entry kind this version does not know."""
    return LogRecord(
        record["messageId"],
        record["sourceId"],
        record["callType"],
        record["userId"],
        record["anonymousId"],
        record["event"],
        tuple([_entry_from_avro(e) for e in record["entries"]]),
    )
