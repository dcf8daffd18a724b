"""Our Avro records as typed values, and the conversions to and from the codec's dicts.

The codec (``pipeline.kafka.codec``) takes and returns dicts keyed as in ``schemas/*.avsc``
(camelCase); everything past the edge uses the ``NamedTuple`` values here (snake_case fields).
NamedTuples, not dataclasses: the delivery hot path builds one per record and replaces a few
fields per attempt, and a tuple is the cheapest value Python builds (see docs/decisions.md).

    >>> d = Delivery("m1", "hooks", "web", "track", b"{}", received_at=5)
    >>> delivery_from_record(delivery_to_record(d)) == d
    True
    >>> delivery_to_record(d._replace(tier=0))["tier"]
    0
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, TypeVar

from pipeline.core.calls import Call, CallType

__all__ = [
    "Attempt",
    "Delivery",
    "DeadLetter",
    "Replay",
    "TraitState",
    "DeletionNotification",
    "DeletionRequestEvent",
    "DeletionRequest",
    "call_to_record",
    "call_from_record",
    "new_delivery",
    "delivery_to_record",
    "delivery_from_record",
    "dead_letter_to_record",
    "dead_letter_from_record",
    "replay_to_record",
    "replay_from_record",
    "trait_state_to_record",
    "trait_state_from_record",
    "deletion_request_to_record",
    "deletion_request_from_record",
    "ReplayPosition",
    "RangeReplay",
    "range_replay_to_record",
    "range_replay_from_record",
]

Record = dict[str, Any]
T = TypeVar("T", bound=tuple[Any, ...])


def _flat(
    make: Callable[[Iterable[Any]], T], keys: tuple[str, ...]
) -> tuple[Callable[[T], Record], Callable[[Record], T]]:
    """The to/from record functions of a flat record whose ``keys`` (the schema's names) are in
    the order of its NamedTuple's fields."""

    def to_record(value: T) -> Record:
        return dict(zip(keys, value, strict=True))

    def from_record(record: Record) -> T:
        return make(record[key] for key in keys)

    return to_record, from_record


# ---- Call ------------------------------------------------------------------------------------


def call_to_record(call: Call) -> Record:
    return {
        "type": call.type.value,
        "messageId": call.message_id,
        "sourceId": call.source_id,
        "timestamp": call.timestamp,
        "receivedAt": call.received_at,
        "userId": call.user_id,
        "anonymousId": call.anonymous_id,
        "sentAt": call.sent_at,
        "event": call.event,
        "name": call.name,
        "category": call.category,
        "groupId": call.group_id,
        "previousId": call.previous_id,
        "properties": call.properties,
        "traits": call.traits,
        "context": call.context,
        "integrations": call.integrations,
    }


def call_from_record(record: Record) -> Call:
    return Call(
        type=CallType(record["type"]),
        message_id=record["messageId"],
        source_id=record["sourceId"],
        timestamp=record["timestamp"],
        received_at=record["receivedAt"],
        user_id=record["userId"],
        anonymous_id=record["anonymousId"],
        sent_at=record["sentAt"],
        event=record["event"],
        name=record["name"],
        category=record["category"],
        group_id=record["groupId"],
        previous_id=record["previousId"],
        properties=record["properties"],
        traits=record["traits"],
        context=record["context"],
        integrations=record["integrations"],
    )


# ---- Delivery --------------------------------------------------------------------------------


class Attempt(NamedTuple):
    """One URL's answer to one attempt, kept on the record (``Attempt`` in delivery.avsc)."""

    at: int
    """When the attempt started, epoch ms."""
    url: str
    status: int | None = None
    error: str | None = None
    duration_ms: int = 0


class Delivery(NamedTuple):
    """One call for one destination (``Delivery`` in delivery.avsc). Times are epoch ms."""

    message_id: str
    destination_id: str
    source_id: str
    call_type: str
    body: bytes
    received_at: int
    first_attempt_at: int | None = None
    deadline: int | None = None
    """No attempt starts after this; set at the first attempt."""
    not_before: int = 0
    tier: int = -1
    """-1 on the main topic, else the retry tier this record was written to."""
    replays: int = 0
    """How often this delivery was sent again: a dead letter's replay, or ``pipeline replay``."""
    attempts: tuple[Attempt, ...] = ()
    user_id: str | None = None
    """The call's user id, ``""`` for an anonymous call: a deletion request suppresses the
    user's pending deliveries by it. ``None``: unknown (a record written before the field
    existed; its body has the user id)."""

    @classmethod
    def for_call(cls, call: Call, destination_id: str, body: bytes) -> Delivery:
        """A fresh delivery for the main topic: no attempt yet, due now."""
        return cls(
            call.message_id,
            destination_id,
            call.source_id,
            call.type.value,
            body,
            call.received_at,
            None,
            None,
            0,
            -1,
            0,
            (),
            call.user_id or "",  # positional: keywords cost twice as much on the router's path
        )

    # The two changes the delivery handler makes, written out: ``_replace`` costs twice as much
    # (keyword parsing), and these run once per attempt.

    def stamped(self, first_attempt_at: int, deadline: int) -> Delivery:
        """This delivery at its first attempt: the attempt's time and the deadline it sets."""
        return Delivery(
            self.message_id,
            self.destination_id,
            self.source_id,
            self.call_type,
            self.body,
            self.received_at,
            first_attempt_at,
            deadline,
            self.not_before,
            self.tier,
            self.replays,
            self.attempts,
            self.user_id,
        )

    def attempted(
        self, attempts: tuple[Attempt, ...], tier: int | None = None, not_before: int | None = None
    ) -> Delivery:
        """This delivery with ``attempts`` appended, and moved to ``tier`` due at ``not_before``
        (both kept when ``None``)."""
        return Delivery(
            self.message_id,
            self.destination_id,
            self.source_id,
            self.call_type,
            self.body,
            self.received_at,
            self.first_attempt_at,
            self.deadline,
            self.not_before if not_before is None else not_before,
            self.tier if tier is None else tier,
            self.replays,
            self.attempts + attempts,
            self.user_id,
        )


def new_delivery(call: Call, destination_id: str, body: bytes) -> Record:
    """A fresh delivery record for the main topic: no attempt yet, due now (the codec's dict)."""
    return delivery_to_record(Delivery.for_call(call, destination_id, body))


def delivery_to_record(delivery: Delivery) -> Record:
    # Lists and exact ints: what the compiled Avro writer takes without falling back to fastavro.
    return {
        "messageId": delivery.message_id,
        "destinationId": delivery.destination_id,
        "sourceId": delivery.source_id,
        "callType": delivery.call_type,
        "body": delivery.body,
        "receivedAt": delivery.received_at,
        "firstAttemptAt": delivery.first_attempt_at,
        "deadline": delivery.deadline,
        "notBefore": delivery.not_before,
        "tier": delivery.tier,
        "replays": delivery.replays,
        "attempts": [
            {
                "at": a.at,
                "url": a.url,
                "status": a.status,
                "error": a.error,
                "durationMs": a.duration_ms,
            }
            for a in delivery.attempts
        ],
        "userId": delivery.user_id,
    }


def delivery_from_record(record: Record) -> Delivery:
    attempts = record["attempts"]
    return Delivery(
        record["messageId"],
        record["destinationId"],
        record["sourceId"],
        record["callType"],
        record["body"],
        record["receivedAt"],
        record["firstAttemptAt"],
        record["deadline"],
        record["notBefore"],
        record["tier"],
        record["replays"],
        tuple(
            Attempt(a["at"], a["url"], a["status"], a["error"], a["durationMs"]) for a in attempts
        )
        if attempts
        else (),
        record["userId"],
    )


# ---- DeadLetter and Replay -------------------------------------------------------------------


class DeadLetter(NamedTuple):
    """A delivery that will not be attempted again (``DeadLetter`` in dead_letter.avsc): the
    delivery when the Kafka record decoded, else its raw bytes."""

    id: str
    reason: str
    detail: str
    dead_lettered_at: int
    source_topic: str
    source_partition: int
    source_offset: int
    delivery: Delivery | None = None
    raw: bytes | None = None


def dead_letter_to_record(letter: DeadLetter) -> Record:
    delivery = letter.delivery
    return {
        "id": letter.id,
        "reason": letter.reason,
        "detail": letter.detail,
        "deadLetteredAt": letter.dead_lettered_at,
        "sourceTopic": letter.source_topic,
        "sourcePartition": letter.source_partition,
        "sourceOffset": letter.source_offset,
        "delivery": None if delivery is None else delivery_to_record(delivery),
        "raw": letter.raw,
    }


def dead_letter_from_record(record: Record) -> DeadLetter:
    delivery = record["delivery"]
    return DeadLetter(
        record["id"],
        record["reason"],
        record["detail"],
        record["deadLetteredAt"],
        record["sourceTopic"],
        record["sourcePartition"],
        record["sourceOffset"],
        None if delivery is None else delivery_from_record(delivery),
        record["raw"],
    )


class Replay(NamedTuple):
    """A dead letter that was replayed (``Replay`` in replay.avsc)."""

    dead_letter_id: str
    replayed_at: int
    message_id: str
    destination_id: str


#: The schema's field names in the order of ``Replay``'s fields (a flat record: zipped).
_REPLAY_KEYS = ("deadLetterId", "replayedAt", "messageId", "destinationId")


replay_to_record, replay_from_record = _flat(Replay._make, _REPLAY_KEYS)


# ---- TraitState ------------------------------------------------------------------------------


class TraitState(NamedTuple):
    """The last value of one trait for one user (``TraitState`` in trait_state.avsc); the values
    are JSON text."""

    value: str | None
    pending: str | None
    pending_at: int | None
    updated_at: int


_TRAIT_STATE_KEYS = ("value", "pending", "pendingAt", "updatedAt")


trait_state_to_record, trait_state_from_record = _flat(TraitState._make, _TRAIT_STATE_KEYS)


# ---- DeletionRequest -------------------------------------------------------------------------


class DeletionNotification(NamedTuple):
    """One delete call a deletion request produced."""

    source_id: str
    message_id: str
    timestamp: int
    acknowledged: bool
    """Kafka acknowledged the delete call; false: it was being sent when the record was written."""


class DeletionRequestEvent(NamedTuple):
    requested_at: int
    reason: str | None = None
    forced: bool = False
    notifications: tuple[DeletionNotification, ...] = ()


class DeletionRequest(NamedTuple):
    """Every deletion request for one user, oldest first (``DeletionRequest``)."""

    user_id: str
    requests: tuple[DeletionRequestEvent, ...] = ()


def deletion_request_to_record(request: DeletionRequest) -> Record:
    return {
        "userId": request.user_id,
        "requests": [
            {
                "requestedAt": event.requested_at,
                "reason": event.reason,
                "forced": event.forced,
                "notifications": [
                    {
                        "sourceId": note.source_id,
                        "messageId": note.message_id,
                        "timestamp": note.timestamp,
                        "acknowledged": note.acknowledged,
                    }
                    for note in event.notifications
                ],
            }
            for event in request.requests
        ],
    }


def deletion_request_from_record(record: Record) -> DeletionRequest:
    return DeletionRequest(
        record["userId"],
        tuple(
            DeletionRequestEvent(
                event["requestedAt"],
                event["reason"],
                event["forced"],
                tuple(
                    DeletionNotification(
                        note["sourceId"], note["messageId"], note["timestamp"], note["acknowledged"]
                    )
                    for note in event["notifications"]
                ),
            )
            for event in record["requests"]
        ),
    )


# ---- RangeReplay -----------------------------------------------------------------------------


class ReplayPosition(NamedTuple):
    """How far a range replay got in one partition of ``calls``."""

    partition: int
    next: int
    """The next offset to read: every record before it was handed off."""
    end: int
    """Where the range was estimated to end when the replay started (for progress)."""
    done: bool = False


class RangeReplay(NamedTuple):
    """A replay of retained calls to one destination and how far it got (``RangeReplay`` in
    range_replay.avsc). Times are epoch ms."""

    id: str
    destination_id: str
    source_id: str | None
    call_type: str | None
    user_id: str | None
    since: int
    until: int
    since_text: str
    until_text: str
    rate: float
    started_at: int
    updated_at: int
    finished_at: int | None = None
    scanned: int = 0
    sent: int = 0
    positions: tuple[ReplayPosition, ...] = ()


def range_replay_to_record(replay: RangeReplay) -> Record:
    return {
        "id": replay.id,
        "destinationId": replay.destination_id,
        "sourceId": replay.source_id,
        "callType": replay.call_type,
        "userId": replay.user_id,
        "since": replay.since,
        "until": replay.until,
        "sinceText": replay.since_text,
        "untilText": replay.until_text,
        "rate": replay.rate,
        "startedAt": replay.started_at,
        "updatedAt": replay.updated_at,
        "finishedAt": replay.finished_at,
        "scanned": replay.scanned,
        "sent": replay.sent,
        "positions": [
            {"partition": p.partition, "next": p.next, "end": p.end, "done": p.done}
            for p in replay.positions
        ],
    }


def range_replay_from_record(record: Record) -> RangeReplay:
    return RangeReplay(
        record["id"],
        record["destinationId"],
        record["sourceId"],
        record["callType"],
        record["userId"],
        record["since"],
        record["until"],
        record["sinceText"],
        record["untilText"],
        record["rate"],
        record["startedAt"],
        record["updatedAt"],
        record["finishedAt"],
        record["scanned"],
        record["sent"],
        tuple(
            ReplayPosition(p["partition"], p["next"], p["end"], p["done"])
            for p in record["positions"]
        ),
    )
