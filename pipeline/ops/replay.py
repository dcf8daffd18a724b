"""``pipeline replay``: re-deliver retained calls of a time range to one destination.

How a replay runs (why each step is so: docs/decisions.md, "Replay and backfill"):

1. The range's first offset in each partition of ``calls`` comes from the broker by time
   (``offsets_for_times``, ``TIMESTAMP_SLACK_MS`` before ``--since``); records whose Kafka
   timestamp is still earlier are passed over without being decoded, and a partition is done at
   its end or at the first record stamped ``TIMESTAMP_SLACK_MS`` after ``--until``. Every call
   read is checked on ``receivedAt``, so the range is exact whatever the broker answered (the
   embedded one answers the log start: it reads the partition from there).
2. Each call of the range is decided as the router decides it now, for this destination
   (``pipeline.core.call_replay.replay_delivery``), and its delivery record goes to the
   deliveries topic, paced at ``rate`` calls a second. The deliver workers send it like any live
   record: live URL, headers and secret, retries, dead letters, suppression after a deletion
   request. Each one gets a ``replayed`` entry in the delivery log naming the replay.
3. About once a second (``CHECKPOINT_SECONDS``), once Kafka acknowledged everything produced so
   far, the replay's progress (the next offset per partition) is written to the compacted topic
   ``replays``. A replay killed at any moment and started again with the same arguments goes on
   from its last checkpoint: what it sends twice is at most what it sent in the last second.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipeline.core.call_replay import (
    TIMESTAMP_SLACK_MS,
    ReplaySelection,
    Skipped,
    default_rate,
    replay_delivery,
)
from pipeline.core.config import ConfigTable, Destination
from pipeline.core.exceptions import BrokerUnavailable, InvalidCall, UndecodableRecord
from pipeline.core.log_entries import LogKind, entry, log_record
from pipeline.core.rate_limit import TokenBucket
from pipeline.core.records import (
    RangeReplay,
    ReplayPosition,
    call_from_record,
    delivery_to_record,
    range_replay_from_record,
    range_replay_to_record,
)
from pipeline.core.settings import Settings
from pipeline.core.timestamps import now_ms
from pipeline.kafka.clients import topics_for
from pipeline.kafka.codec import RecordCodec
from pipeline.kafka.config_store import load_table
from pipeline.kafka.log_batches import log_batch_records
from pipeline.kafka.producer import AckedProducer
from pipeline.kafka.registry_codec import make_codec
from pipeline.kafka.topic_reader import READ_IDLE_TIMEOUT, TopicReader, read_topic
from pipeline.runtime.tracing import TraceHeaders, step, trace_headers

__all__ = [
    "ReplayPlan",
    "ReplayResult",
    "CHECKPOINT_SECONDS",
    "plan_replay",
    "run_replay",
    "read_replays",
]

#: How often a running replay records how far it got: at most this much sending is repeated
#: after a crash.
CHECKPOINT_SECONDS = 1.0
#: Calls a replay may send at once after a pause, as a share of its rate per second.
_BURST_SHARE = 0.1

#: Called after each record read: (records read, calls sent) so far.
Progress = Callable[[int, int], None]


@dataclass
class ReplayPlan:
    """A replay about to run: a new one, or one interrupted earlier with the same arguments."""

    selection: ReplaySelection
    destination: Destination
    table: ConfigTable
    state: RangeReplay
    resumed: bool
    #: Other replays to this destination whose range and filters overlap this one's: some of
    #: these calls were probably sent to it already.
    earlier: list[RangeReplay] = field(default_factory=list)

    @property
    def to_read(self) -> int:
        """Records of ``calls`` left to read (an estimate: progress and ETA)."""
        return sum(max(0, p.end - p.next) for p in self.state.positions if not p.done)


@dataclass
class ReplayResult:
    state: RangeReplay
    #: Calls sent (or, in a dry run, that would be sent), by (call type, source).
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    #: Calls of the range not sent, by reason (``Skipped``, ``undecodable``).
    skipped: Counter[str] = field(default_factory=Counter)
    interrupted: bool = False


def read_replays(settings: Settings, codec: RecordCodec | None = None) -> dict[str, RangeReplay]:
    """Every replay recorded on the ``replays`` topic, by id, as last written."""
    codec = codec or make_codec(settings)
    replays: dict[str, RangeReplay] = {}
    for message in read_topic(settings, topics_for(settings).replays):
        key = (message.key() or b"").decode()
        if message.value() is None:
            replays.pop(key, None)
        else:
            replays[key] = range_replay_from_record(codec.decode("RangeReplay", message.value()))
    return replays


def plan_replay(
    settings: Settings, selection: ReplaySelection, *, rate: float | None = None
) -> ReplayPlan:
    """Check the selection against the live config, and find where to start: the last
    checkpoint of an unfinished replay with the same arguments, else the range's first offsets.
    ``InvalidCall`` naming the flag for a selection that cannot run."""
    if rate is not None and rate <= 0:
        raise InvalidCall("--rate", f"must be above 0 calls per second, got {rate:g}")
    table = load_table(settings)
    destination = selection.check(table)
    replays = read_replays(settings)
    unfinished = [
        r for r in replays.values() if r.finished_at is None and selection.same_arguments(r)
    ]
    if unfinished:
        state = max(unfinished, key=lambda r: r.updated_at)
        if rate is not None:
            state = state._replace(rate=rate)
        # The range as it was resolved when it started (``2h`` meant two hours before then).
        selection = ReplaySelection(
            selection.destination,
            state.since,
            state.until,
            selection.since_text,
            selection.until_text,
            selection.source,
            selection.call_type,
            selection.user,
        )
        resumed = True
    else:
        now = now_ms()
        state = RangeReplay(
            id=f"replay-{uuid.uuid4().hex[:12]}",
            destination_id=selection.destination,
            source_id=selection.source,
            call_type=None if selection.call_type is None else selection.call_type.value,
            user_id=selection.user,
            since=selection.since,
            until=selection.until,
            since_text=selection.since_text,
            until_text=selection.until_text,
            rate=rate if rate is not None else default_rate(destination),
            started_at=now,
            updated_at=now,
            positions=_first_positions(settings, selection),
        )
        resumed = False
    earlier = sorted(
        (r for r in replays.values() if r.id != state.id and selection.overlaps(r)),
        key=lambda r: r.started_at,
    )
    return ReplayPlan(selection, destination, table, state, resumed, earlier)


def _first_positions(settings: Settings, selection: ReplaySelection) -> tuple[ReplayPosition, ...]:
    """Per partition of ``calls``, where the range starts and (about) where it ends."""
    reader = TopicReader(settings, topics_for(settings).calls)
    try:
        partitions = reader.partitions()
        starts = reader.offsets_for_time(partitions, selection.since - TIMESTAMP_SLACK_MS)
        ends = reader.offsets_for_time(partitions, selection.until + TIMESTAMP_SLACK_MS)
        positions = []
        for partition in partitions:
            high = reader.end_offset(partition)
            start, end = starts[partition], ends[partition]
            if start < 0:  # no record at or after --since: nothing of the range is here
                positions.append(ReplayPosition(partition, high, high, done=True))
                continue
            # A broker that does not look offsets up by time answers no later offset for
            # --until than for --since: then the partition's end is the estimate.
            positions.append(ReplayPosition(partition, start, end if end > start else high))
        return tuple(positions)
    finally:
        reader.close()


def run_replay(
    settings: Settings,
    plan: ReplayPlan,
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
) -> ReplayResult:
    """Send the plan's calls (``dry_run``: only count them). ``stop`` set (the command sets it on
    Ctrl-C) ends it after the record at hand, a ``KeyboardInterrupt`` wherever it lands; either
    way it is checkpointed, the result says ``interrupted`` and the same arguments resume it."""
    run = _Run(settings, plan, dry_run, progress)
    try:
        run.read(stop or threading.Event())
        run.result.interrupted = not all(p.done for p in run.positions.values())
    except KeyboardInterrupt:
        run.result.interrupted = True
    if not dry_run:
        run.checkpoint(finished=not run.result.interrupted)
    return run.result


class _Run:
    """One pass over the plan's partitions of ``calls``, from the checkpoint to the range's end."""

    def __init__(
        self, settings: Settings, plan: ReplayPlan, dry_run: bool, progress: Progress | None
    ) -> None:
        self.settings = settings
        self.plan = plan
        self.dry_run = dry_run
        self.progress = progress
        self.codec = make_codec(settings)
        self.topics = topics_for(settings)
        self.positions = {p.partition: p for p in plan.state.positions}
        self.result = ReplayResult(plan.state)
        self.scanned = plan.state.scanned
        self.sent = plan.state.sent
        self.logged: list[dict[str, Any]] = []
        self.producer = None if dry_run else AckedProducer(settings)
        self.bucket = TokenBucket(
            rate=plan.state.rate, burst=max(1.0, plan.state.rate * _BURST_SHARE)
        )
        self.last_checkpoint = time.monotonic()
        if self.producer is not None and not plan.resumed:
            self.checkpoint()  # recorded before the first send: resumable from the start

    def read(self, stop: threading.Event) -> None:
        pending = {p: pos.next for p, pos in self.positions.items() if not pos.done}
        if not pending:
            return
        plan = self.plan
        earliest = plan.selection.since - TIMESTAMP_SLACK_MS
        latest = plan.selection.until + TIMESTAMP_SLACK_MS
        reader = TopicReader(self.settings, self.topics.calls)
        try:
            reader.assign_at(pending)
            stalled = time.monotonic() + READ_IDLE_TIMEOUT
            while pending and not stop.is_set():
                records, ended = reader.poll(0.1, max_records=500)
                for message in records:
                    if stop.is_set():
                        return
                    partition, offset = message.partition(), message.offset()
                    assert partition is not None and offset is not None
                    if partition not in pending:
                        continue  # released: its range ended
                    stamp = message.timestamp()[1]
                    if stamp > latest:  # past the range (with its slack): the partition is done
                        self._done(partition, offset)
                        del pending[partition]
                        reader.release([partition])
                        continue
                    if stamp >= earliest or stamp < 0:  # < 0: the broker gave no timestamp
                        self._consider(message.value(), trace_headers(message.headers()))
                    self.scanned += 1
                    self.positions[partition] = self.positions[partition]._replace(next=offset + 1)
                    if self.progress is not None:
                        self.progress(self.scanned, self.sent)
                    if time.monotonic() - self.last_checkpoint >= CHECKPOINT_SECONDS:
                        self.checkpoint()
                for partition in ended & pending.keys():
                    self._done(partition, self.positions[partition].next)
                    del pending[partition]
                if records or ended:
                    stalled = time.monotonic() + READ_IDLE_TIMEOUT
                elif time.monotonic() > stalled:
                    raise BrokerUnavailable(
                        f"reading {self.topics.calls!r} stalled: no record and no end of "
                        f"partition within {READ_IDLE_TIMEOUT:.0f} s; run the same command "
                        "again to resume"
                    )
        finally:
            reader.close()

    def _done(self, partition: int, next_offset: int) -> None:
        self.positions[partition] = self.positions[partition]._replace(next=next_offset, done=True)

    def _consider(self, value: bytes | None, trace: TraceHeaders) -> None:
        """One record of the range's time window (``trace``: its trace context): sent (or
        counted) if it is a call of the selection that live routing would send to the
        destination; in the call's trace, after a step that says it was replayed."""
        plan = self.plan
        try:
            call = call_from_record(self.codec.decode("Call", value))
        except (UndecodableRecord, KeyError, ValueError):
            self.result.skipped["undecodable"] += 1  # the router dead-lettered it
            return
        if not plan.selection.matches(call):
            return
        decision = replay_delivery(call, plan.table, plan.destination.id)
        if isinstance(decision, Skipped):
            self.result.skipped[decision.value] += 1
            return
        counted = (call.type.value, call.source_id)
        if self.producer is None:
            self.result.counts[counted] += 1
            return
        wait = self.bucket.reserve()
        if wait > 0:
            time.sleep(wait)
        key, delivery = decision
        value = self.codec.encode("Delivery", delivery_to_record(delivery))
        attributes = {"pipeline.replay": plan.state.id, "pipeline.destination": plan.destination.id}
        trace = step(trace, "replay (range)", attributes)
        self.producer.produce(self.topics.deliveries, key, value, headers=trace)
        self.result.counts[counted] += 1
        self.sent += 1
        if self.settings.log:
            replayed = entry(
                LogKind.REPLAYED,
                now_ms(),
                destination=delivery.destination_id,
                replayId=plan.state.id,
            )
            self.logged.append(
                log_record(
                    call.message_id,
                    call.source_id,
                    call.type.value,
                    [replayed],
                    user_id=call.user_id,
                    anonymous_id=call.anonymous_id,
                    event=call.event,
                )
            )

    def checkpoint(self, *, finished: bool = False) -> None:
        """Once Kafka has everything produced so far, record how far the replay got."""
        producer = self.producer
        assert producer is not None
        if self.logged:
            for topic, key, value in log_batch_records(self.codec, self.topics.log, self.logged):
                producer.produce(topic, key, value)
            self.logged = []
        producer.flush()
        if producer.failed:
            raise BrokerUnavailable(
                f"Kafka refused {len(producer.failed)} records ({producer.failed[0]}); the "
                "replay stopped at its last checkpoint: run the same command again to resume"
            )
        now = now_ms()
        state = self.result.state._replace(
            updated_at=now,
            finished_at=now if finished else None,
            scanned=self.scanned,
            sent=self.sent,
            positions=tuple(self.positions[p] for p in sorted(self.positions)),
        )
        value = self.codec.encode("RangeReplay", range_replay_to_record(state))
        producer.produce(self.topics.replays, state.id.encode(), value)
        producer.flush()
        if producer.failed:
            raise BrokerUnavailable(
                f"Kafka refused the replay's checkpoint ({producer.failed[0]}); run the same "
                "command again to resume"
            )
        self.result.state = state
        self.last_checkpoint = time.monotonic()
