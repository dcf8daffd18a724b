"""Dead letters: list them, and replay them with a fresh deadline.

A replay puts the delivery on the first retry tier, due now, with its deadline cleared (the next
attempt starts a new one) and ``replays`` counted up; the attempts of its earlier life are kept.
Each replay is recorded on ``deliveries.webhooks.dlq.replays`` (compacted, keyed by dead-letter id)
*in the same Kafka transaction* as the replayed record, so a dead letter is never replayed twice by
accident, not even by a replay that crashed half-way.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Producer

from pipeline.core.durations import parse_duration
from pipeline.core.exceptions import BrokerUnavailable
from pipeline.core.settings import Settings
from pipeline.core.timestamps import now_ms, parse_timestamp
from pipeline.kafka.clients import producer_config, topics_for
from pipeline.kafka.codec import RecordCodec
from pipeline.kafka.registry_codec import make_codec
from pipeline.kafka.topic_reader import read_topic

__all__ = ["DlqFilter", "DeadLetterEntry", "list_dead_letters", "replay_dead_letters", "parse_when"]


def parse_when(text: str, *, now: int | None = None) -> int:
    """Epoch ms from an ISO 8601 time or a duration ago (``90m``: ninety minutes ago)."""
    now = now_ms() if now is None else now
    try:
        return now - int(parse_duration(text) * 1000)
    except ValueError:
        pass
    try:
        return parse_timestamp(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a duration ago (e.g. 30m, 2h) nor an ISO 8601 time"
        ) from None


@dataclass(frozen=True, slots=True)
class DlqFilter:
    destination: str | None = None
    reason: str | None = None
    since: int | None = None
    until: int | None = None

    def matches(self, letter: dict[str, Any]) -> bool:
        delivery = letter["delivery"] or {}
        at = letter["deadLetteredAt"]
        return (
            (self.destination is None or delivery.get("destinationId") == self.destination)
            and (self.reason is None or letter["reason"] == self.reason)
            and (self.since is None or at >= self.since)
            and (self.until is None or at <= self.until)
        )


@dataclass(frozen=True, slots=True)
class DeadLetterEntry:
    letter: dict[str, Any]
    replayed_at: int | None

    @property
    def replayable(self) -> bool:
        return self.letter["delivery"] is not None


def _replayed(settings: Settings, codec: RecordCodec) -> dict[str, int]:
    replayed: dict[str, int] = {}
    for message in read_topic(settings, topics_for(settings).dlq_replays):
        if message.value() is not None:
            record = codec.decode("Replay", message.value())
            replayed[record["deadLetterId"]] = record["replayedAt"]
    return replayed


def list_dead_letters(settings: Settings, selection: DlqFilter) -> list[DeadLetterEntry]:
    codec = make_codec(settings)
    replayed = _replayed(settings, codec)
    entries = []
    for message in read_topic(settings, topics_for(settings).dlq):
        letter = codec.decode("DeadLetter", message.value())
        if selection.matches(letter):
            entries.append(DeadLetterEntry(letter, replayed.get(letter["id"])))
    return entries


@dataclass
class ReplaySummary:
    replayed: list[DeadLetterEntry] = field(default_factory=list)
    already_replayed: int = 0
    not_replayable: int = 0


def replay_dead_letters(
    settings: Settings, selection: DlqFilter, *, dry_run: bool = False, timeout: float = 30.0
) -> ReplaySummary:
    """Re-enqueue the selected dead letters that were not replayed before."""
    summary = ReplaySummary()
    for entry in list_dead_letters(settings, selection):
        if entry.replayed_at is not None:
            summary.already_replayed += 1
        elif not entry.replayable:
            summary.not_replayable += 1
        else:
            summary.replayed.append(entry)
    if dry_run or not summary.replayed:
        return summary

    codec = make_codec(settings)
    topics = topics_for(settings)
    producer = Producer(
        producer_config(settings, **{"transactional.id": f"pipeline-dlq-replay-{uuid.uuid4()}"})
    )
    try:
        producer.init_transactions(timeout)
        producer.begin_transaction()
        now = now_ms()
        for entry in summary.replayed:
            delivery = dict(entry.letter["delivery"])
            delivery.update(
                firstAttemptAt=None,
                deadline=None,
                notBefore=now,
                tier=0,
                replays=delivery["replays"] + 1,
            )
            key = f"{delivery['destinationId']}/{delivery['messageId']}".encode()
            producer.produce(topics.retry[0], codec.encode("Delivery", delivery), key)
            marker = {
                "deadLetterId": entry.letter["id"],
                "replayedAt": now,
                "messageId": delivery["messageId"],
                "destinationId": delivery["destinationId"],
            }
            producer.produce(
                topics.dlq_replays, codec.encode("Replay", marker), entry.letter["id"].encode()
            )
            producer.poll(0)
        producer.commit_transaction(timeout)
    except Exception as exc:
        try:
            producer.abort_transaction(5)
        except Exception:  # noqa: S110 - the original error is the one to report
            pass
        raise BrokerUnavailable(f"replay aborted, nothing was replayed: {exc}") from None
    return summary


def describe_time(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))
