"""``pipeline delete-user USER_ID``: deletion requests (seed §1.6, §6).

A deletion request produces one ``delete`` call per affected source: a source with at least one
enabled destination connected. The router delivers it like any call; the body is exactly
``{"type":"delete","userId":...,"timestamp":...}``.

Every request is recorded in the compacted topic ``deletion-requests``, keyed by user id, one
record per user holding that user's whole history (the latest ``MAX_HISTORY`` requests): when, why,
and which sources were sent a delete call with which messageId. Repeating a request notifies only
the affected sources that were never notified (a source connected since, say); ``--force`` notifies
every affected source again. A repeat that sends nothing is still recorded.

The order is the one of audience syncs (``pipeline.ops.audience_sync``): write the request with its
notifications unacknowledged, produce the delete calls, then write it again acknowledged, each step
acknowledged by Kafka before the next. A crash in between leaves unacknowledged notifications; the
next request sends them again with the same messageIds (receivers can dedupe).
"""

from __future__ import annotations

import argparse
import sys
import uuid
from dataclasses import dataclass, field

from pipeline.core.calls import MAX_ID_CHARS, Call, CallType
from pipeline.core.config import ConfigTable
from pipeline.core.exceptions import BrokerUnavailable, InvalidCall
from pipeline.core.records import (
    DeletionNotification,
    DeletionRequest,
    DeletionRequestEvent,
    call_to_record,
    deletion_request_from_record,
    deletion_request_to_record,
)
from pipeline.core.settings import Settings
from pipeline.core.timestamps import format_timestamp, now_ms
from pipeline.kafka.clients import topics_for
from pipeline.kafka.config_store import load_table
from pipeline.kafka.producer import AckedProducer
from pipeline.kafka.registry_codec import make_codec
from pipeline.kafka.state_topic import read_partition

__all__ = [
    "DeletionOutcome",
    "affected_sources",
    "plan_notifications",
    "read_request",
    "request_deletion",
    "run_delete_user",
    "MAX_HISTORY",
    "MAX_REASON_CHARS",
]

#: Requests kept per user in the record (older ones are dropped from it).
MAX_HISTORY = 100
MAX_REASON_CHARS = 1000


@dataclass
class DeletionOutcome:
    user_id: str
    requested_at: int
    #: Sources sent a delete call now, acknowledged by Kafka.
    notified: list[str] = field(default_factory=list)
    #: Affected sources not sent one now because an earlier request already did.
    already: dict[str, int] = field(default_factory=dict)
    #: Sources with no enabled destination (never notified).
    unaffected: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def affected_sources(table: ConfigTable) -> list[str]:
    """Sources with at least one enabled destination connected, sorted."""
    return sorted(s for s in table.sources if table.enabled_destinations(s))


def plan_notifications(
    record: DeletionRequest | None, affected: list[str], *, force: bool
) -> tuple[dict[str, str | None], dict[str, int]]:
    """Which sources to notify now, each with a messageId to reuse (or None: a new one), and
    which affected sources earlier requests already notified (source → when). Pure logic.

    >>> old = DeletionRequest("u", (DeletionRequestEvent(5, notifications=(
    ...     DeletionNotification("web", "m1", 5, acknowledged=True),
    ...     DeletionNotification("ios", "m2", 5, acknowledged=False))),))
    >>> plan_notifications(old, ["ios", "web", "android"], force=False)
    ({'ios': 'm2', 'android': None}, {'web': 5})
    """
    done: dict[str, int] = {}
    unfinished: dict[str, str] = {}
    for request in record.requests if record else ():
        for note in request.notifications:
            if note.acknowledged:
                done[note.source_id] = note.timestamp
                unfinished.pop(note.source_id, None)
            elif note.source_id not in done:
                unfinished[note.source_id] = note.message_id
    if force:
        return {source: None for source in affected}, {}
    todo = {s: unfinished.get(s) for s in affected if s not in done}
    return todo, {s: done[s] for s in affected if s in done}


def _check_user(user_id: str) -> None:
    if not user_id.strip():
        raise InvalidCall("USER_ID", "is empty")
    if len(user_id) > MAX_ID_CHARS:
        raise InvalidCall(
            "USER_ID", f"is {len(user_id):,} characters, over the limit of {MAX_ID_CHARS:,}"
        )


def _read(settings: Settings, user_id: str) -> tuple[DeletionRequest | None, int]:
    codec = make_codec(settings)
    key = user_id.encode()
    found: list[DeletionRequest | None] = [None]

    def on_record(record_key: bytes, value: bytes | None) -> None:
        if record_key == key:
            found[0] = (
                None
                if value is None
                else deletion_request_from_record(codec.decode("DeletionRequest", value))
            )

    topic = topics_for(settings).deletion_requests
    partition, _count = read_partition(settings, topic, key, on_record, key_prefix=key)
    return found[0], partition


def read_request(settings: Settings, user_id: str) -> DeletionRequest | None:
    """The user's deletion record, or None when there was never one."""
    _check_user(user_id)
    return _read(settings, user_id)[0]


def request_deletion(
    settings: Settings,
    user_id: str,
    *,
    reason: str | None = None,
    force: bool = False,
    table: ConfigTable | None = None,
) -> DeletionOutcome:
    """Record a deletion request and send one delete call per affected source not yet notified."""
    _check_user(user_id)
    if reason is not None and len(reason) > MAX_REASON_CHARS:
        raise InvalidCall(
            "--reason", f"is {len(reason):,} characters, over the limit of {MAX_REASON_CHARS:,}"
        )
    # Created first: the idempotent producer's set-up overlaps with the reads below.
    producer = AckedProducer(settings)
    table = table if table is not None else load_table(settings)
    affected = affected_sources(table)
    record, partition = _read(settings, user_id)
    todo, already = plan_notifications(record, affected, force=force)

    now = now_ms()
    outcome = DeletionOutcome(user_id, now, already=already)
    outcome.unaffected = sorted(set(table.sources) - set(affected))
    notes = tuple(
        DeletionNotification(s, mid or str(uuid.uuid4()), now, acknowledged=False)
        for s, mid in todo.items()
    )
    event = DeletionRequestEvent(now, reason, force, notes)
    history = record.requests if record else ()
    # The new event is last: acknowledging it below replaces the last element.
    pending = DeletionRequest(
        record.user_id if record else user_id, (*history, event)[-MAX_HISTORY:]
    )

    codec = make_codec(settings)
    topics = topics_for(settings)
    key = user_id.encode()

    def write(request: DeletionRequest) -> None:
        value = codec.encode("DeletionRequest", deletion_request_to_record(request))
        producer.produce(topics.deletion_requests, key, value, partition=partition)
        producer.flush()

    write(pending)
    if producer.failed:
        raise BrokerUnavailable(
            f"Kafka refused the deletion request record ({producer.failed[0]}); nothing was sent"
        )
    if not notes:
        return outcome

    for note in notes:
        call = Call(
            type=CallType.DELETE,
            message_id=note.message_id,
            source_id=note.source_id,
            timestamp=now,
            received_at=now,
            user_id=user_id,
        )
        producer.produce(topics.calls, call.key, codec.encode("Call", call_to_record(call)))
    producer.flush()
    if producer.failed:
        outcome.failed = [str(failure) for failure in producer.failed]
        return outcome  # left unacknowledged in the record: the next request sends them again

    outcome.notified = [note.source_id for note in notes]
    acked = event._replace(notifications=tuple(n._replace(acknowledged=True) for n in notes))
    write(pending._replace(requests=(*pending.requests[:-1], acked)))
    outcome.failed = [str(failure) for failure in producer.failed]
    return outcome


# ---- the command line ----------------------------------------------------------------------------


def _print_outcome(outcome: DeletionOutcome) -> None:
    user = outcome.user_id
    if outcome.notified:
        print(
            f"deletion request for user {user!r} recorded; delete call sent for "
            f"{len(outcome.notified)} source(s): {', '.join(outcome.notified)}"
        )
    elif outcome.failed:
        print(f"deletion request for user {user!r} recorded; sending the delete calls failed")
    else:
        print(f"deletion request for user {user!r} recorded; no delete call sent")
    for source, at in sorted(outcome.already.items()):
        print(f"  {source}: already notified at {format_timestamp(at)} (--force sends again)")
    if outcome.unaffected:
        print(f"  not notified (no enabled destination): {', '.join(outcome.unaffected)}")


def _print_status(user_id: str, record: DeletionRequest | None) -> int:
    if record is None:
        print(f"no deletion request for user {user_id!r}")
        return 1
    requests = record.requests
    print(f"user {user_id!r}: {len(requests)} deletion request(s)")
    for request in requests:
        flags = " (forced)" if request.forced else ""
        reason = f" reason: {request.reason!r}" if request.reason else ""
        print(f"  {format_timestamp(request.requested_at)}{flags}{reason}")
        if not request.notifications:
            print("    nothing sent")
        for note in request.notifications:
            state = "sent" if note.acknowledged else "NOT CONFIRMED (sent again on next request)"
            print(
                f"    {note.source_id:<24} delete {state} at {format_timestamp(note.timestamp)} "
                f"messageId {note.message_id}"
            )
    return 0


def run_delete_user(args: argparse.Namespace, settings: Settings) -> int:
    """``pipeline delete-user USER_ID [--reason TEXT] [--force]`` and ``--status USER_ID``."""
    if args.status:
        if args.force or args.reason is not None:
            raise InvalidCall("--status", "only shows a request; drop --force and --reason")
        return _print_status(args.user_id, read_request(settings, args.user_id))
    outcome = request_deletion(settings, args.user_id, reason=args.reason, force=args.force)
    _print_outcome(outcome)
    if outcome.failed:
        print(
            f"error: Kafka refused {len(outcome.failed)} records ({outcome.failed[0]}); "
            "run the request again to send what is missing",
            file=sys.stderr,
        )
        return 1
    return 0
