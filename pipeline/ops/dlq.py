"""Dead letters: list them, and replay them with a fresh deadline.

A replay puts the delivery on the first retry tier, due now, with its deadline cleared (the next
attempt starts a new one) and ``replays`` counted up; the attempts of its earlier life are kept.
Each replay is recorded on ``deliveries.webhooks.dlq.replays`` (compacted, keyed by dead-letter id)
*in the same Kafka transaction* as the replayed record, so a dead letter is never replayed twice by
accident, not even by a replay that crashed half-way. The delivery log's ``replayed`` entry (with
the replay's id) goes in that transaction too.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.dead_letters import replay
from pipeline.core.log_entries import LogKind, log_record
from pipeline.core.log_entries import entry as entry_of
from pipeline.core.records import (
    DeadLetter,
    dead_letter_from_record,
    dead_letter_to_record,
    delivery_to_record,
    replay_from_record,
    replay_to_record,
)
from pipeline.core.settings import Settings
from pipeline.core.timestamps import now_ms
from pipeline.kafka.clients import topics_for
from pipeline.kafka.codec import RecordCodec
from pipeline.kafka.config_store import load_table
from pipeline.kafka.log_batches import log_batch_records
from pipeline.kafka.producer import AckedProducer
from pipeline.kafka.registry_codec import make_codec
from pipeline.kafka.topic_reader import read_topic
from pipeline.runtime.tracing import TraceHeaders, step, trace_headers

__all__ = ["DlqFilter", "DeadLetterEntry", "list_dead_letters", "replay_dead_letters"]


@dataclass(frozen=True, slots=True)
class DlqFilter:
    destination: str | None = None
    reason: str | None = None
    since: int | None = None
    until: int | None = None
    #: Only these dead letters (their ids), e.g. the ones ticked in the console.
    ids: frozenset[str] | None = None

    def matches(self, letter: DeadLetter) -> bool:
        delivery = letter.delivery
        at = letter.dead_lettered_at
        return (
            (
                self.destination is None
                or (delivery is not None and delivery.destination_id == self.destination)
            )
            and (self.reason is None or letter.reason == self.reason)
            and (self.since is None or at >= self.since)
            and (self.until is None or at <= self.until)
            and (self.ids is None or letter.id in self.ids)
        )


@dataclass(frozen=True, slots=True)
class DeadLetterEntry:
    dead_letter: DeadLetter
    replayed_at: int | None
    #: The trace context of its call (``pipeline.runtime.tracing``).
    trace: TraceHeaders = ()

    @property
    def letter(self) -> dict[str, Any]:
        """The dead letter as the codec's record (the schema's camelCase keys), for display."""
        return dead_letter_to_record(self.dead_letter)

    @property
    def replayable(self) -> bool:
        return self.dead_letter.delivery is not None


def _replayed(settings: Settings, codec: RecordCodec) -> dict[str, int]:
    replayed: dict[str, int] = {}
    for message in read_topic(settings, topics_for(settings).dlq_replays):
        if message.value() is not None:
            marker = replay_from_record(codec.decode("Replay", message.value()))
            replayed[marker.dead_letter_id] = marker.replayed_at
    return replayed


def list_dead_letters(settings: Settings, selection: DlqFilter) -> list[DeadLetterEntry]:
    codec = make_codec(settings)
    replayed = _replayed(settings, codec)
    entries = []
    for message in read_topic(settings, topics_for(settings).dlq):
        letter = dead_letter_from_record(codec.decode("DeadLetter", message.value()))
        if selection.matches(letter):
            trace = trace_headers(message.headers())
            entries.append(DeadLetterEntry(letter, replayed.get(letter.id), trace))
    return entries


@dataclass
class ReplaySummary:
    replayed: list[DeadLetterEntry] = field(default_factory=list)
    already_replayed: int = 0
    not_replayable: int = 0
    #: Names this replay in the delivery log's ``replayed`` entries.
    replay_id: str = ""
    #: The destinations of the replayed letters that order their calls per user now.
    ordered: list[str] = field(default_factory=list)


def replay_dead_letters(
    settings: Settings,
    selection: DlqFilter,
    *,
    dry_run: bool = False,
    timeout: float = 30.0,
    progress: Callable[[int, int], None] | None = None,
) -> ReplaySummary:
    """Re-enqueue the selected dead letters that were not replayed before.

    ``progress(done, total)`` is told after each record is handed to the producer; nothing is
    visible to the workers until the transaction commits at the end (all or none).
    """
    summary = ReplaySummary()
    for entry in list_dead_letters(settings, selection):
        if entry.replayed_at is not None:
            summary.already_replayed += 1
        elif not entry.replayable:
            summary.not_replayable += 1
        else:
            summary.replayed.append(entry)
    if summary.replayed:
        destinations = load_table(settings, timeout).destinations
        summary.ordered = sorted(
            {
                letter.destination_id
                for entry in summary.replayed
                if (letter := entry.dead_letter.delivery) is not None
                and (found := destinations.get(letter.destination_id)) is not None
                and found.ordered
            }
        )
    if dry_run or not summary.replayed:
        return summary

    codec = make_codec(settings)
    topics = topics_for(settings)
    producer = AckedProducer(settings, transactional=True)
    now = now_ms()
    summary.replay_id = f"dlq-{uuid.uuid4().hex[:12]}"
    logged = []
    total = len(summary.replayed)
    with producer.transaction(timeout, what="replay"):
        for done, entry in enumerate(summary.replayed, 1):
            delivery, marker = replay(entry.dead_letter, now)
            key = f"{delivery.destination_id}/{delivery.message_id}".encode()
            value = codec.encode("Delivery", delivery_to_record(delivery))
            # It goes on in its call's trace, after a step that says it was replayed.
            attributes = {
                "pipeline.replay": summary.replay_id,
                "pipeline.destination": delivery.destination_id,
            }
            trace = step(entry.trace, "replay (dead letter)", attributes)
            producer.produce(topics.retry[0], key, value, headers=trace)
            producer.produce(
                topics.dlq_replays,
                marker.dead_letter_id.encode(),
                codec.encode("Replay", replay_to_record(marker)),
            )
            if progress is not None:
                progress(done, total)
            if settings.log:
                replayed = entry_of(
                    LogKind.REPLAYED,
                    now,
                    destination=delivery.destination_id,
                    replayId=summary.replay_id,
                )
                logged.append(
                    log_record(
                        delivery.message_id, delivery.source_id, delivery.call_type, [replayed]
                    )
                )
        for log_topic, _, log_value in log_batch_records(codec, topics.log, logged):
            producer.produce(log_topic, None, log_value)
    return summary


def describe_time(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))
