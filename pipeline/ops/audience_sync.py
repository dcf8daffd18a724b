"""``pipeline audience sync`` and ``pipeline traits sync``: identify calls for what changed.

One mechanism serves both (an audience is a computed trait whose values are true/false). A sync:

1. reads the file into the desired values and validates all of it (``pipeline.core.audience``);
2. reads the audience's state from the compacted topic ``audience-state``: one record per user,
   keyed ``<source>/<property>/<user>``, all of one audience in one pinned partition, read from the
   beginning to the end of that partition, keeping only this audience's keys (memory grows with
   the audience, not with the topic);
3. diffs, and for every change runs three steps, each acknowledged by Kafka before the next:

   a. **mark**: write a state record ``{value: <old>, pending: <new>, messageId}``;
   b. **send**: produce the identify calls to ``calls`` (the router delivers them as usual);
   c. **confirm**: write ``{value: <new>}``, or a tombstone when the new value is false/null.

Why this order. State must never claim a value receivers may not have: the calls go before the
confirmation, so a crash between (b) and (c) leaves the old value plus a pending mark, and the next
sync re-sends those users (at-least-once; same value → same messageId, so receivers can dedupe).
The mark in (a) covers what a plain "send, then write state" order cannot: a crash after (b) and a
re-run with a *different* file. Without the mark, a user sent ``true`` and then dropped from the
file would have no state, get nothing, and keep ``true`` forever. With it the user is uncertain
and gets the value the new file says. So a re-run, with any file, never leaves a wrong value.

Two syncs of the same audience at the same moment are not coordinated (run one at a time).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson
from tqdm import tqdm

from pipeline.core.audience import (
    Change,
    DiffCounts,
    StateEntry,
    SyncInput,
    TraitKind,
    TraitSpec,
    diff,
    message_id_for,
    read_members,
    read_values,
)
from pipeline.core.calls import Call, CallType
from pipeline.core.config import ConfigTable
from pipeline.core.exceptions import BrokerUnavailable, InvalidCall
from pipeline.core.records import (
    TraitState,
    call_to_record,
    trait_state_from_record,
    trait_state_to_record,
)
from pipeline.core.settings import Settings
from pipeline.core.timestamps import now_ms
from pipeline.kafka.clients import topics_for
from pipeline.kafka.codec import RecordCodec
from pipeline.kafka.config_store import load_table
from pipeline.kafka.producer import AckedProducer
from pipeline.kafka.registry_codec import make_codec
from pipeline.kafka.state_topic import read_partition

__all__ = [
    "SyncSummary",
    "load_state",
    "sync",
    "read_input",
    "run_audience_sync",
    "run_traits_sync",
]

_COMPUTATION_CLASS = {TraitKind.AUDIENCE: "audience", TraitKind.COMPUTED: "computed_trait"}


@dataclass
class SyncSummary:
    spec: TraitSpec
    input: SyncInput
    counts: DiffCounts = field(default_factory=DiffCounts)
    #: Identify calls Kafka acknowledged.
    sent: int = 0
    #: Users who had a state record before this sync (0: the first sync).
    known_users: int = 0
    dry_run: bool = False
    failed: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def first_sync(self) -> bool:
        return self.known_users == 0

    def as_json(self) -> dict[str, Any]:
        counts = self.counts
        return {
            "kind": self.spec.kind.value,
            "source": self.spec.source_id,
            "name": self.spec.name,
            "property": self.spec.property_name,
            "first_sync": self.first_sync,
            "dry_run": self.dry_run,
            "users": len(self.input.values),
            "rows": self.input.rows,
            "duplicates": self.input.duplicates,
            "blank_lines": self.input.blank,
            "added": counts.added,
            "changed": counts.changed,
            "removed": counts.removed,
            "unchanged": counts.unchanged,
            "resent": counts.resent,
            "sent": self.sent,
            "failed": len(self.failed),
            "seconds": round(self.seconds, 3),
        }


class _StateRecords:
    """``TraitState`` records through two small caches. Within a sync most records are byte for
    byte the same (``{value: true, updatedAt: T}``), so each distinct one is encoded once and
    each distinct small one decoded once; the caches stop growing at ``LIMIT`` entries."""

    LIMIT = 4096
    #: Larger records (long string values) are decoded every time.
    SMALL = 64

    def __init__(self, codec: RecordCodec) -> None:
        self._codec = codec
        self._encoded: dict[tuple[str | None, str | None, int | None, int], bytes] = {}
        self._decoded: dict[bytes, tuple[str | None, str | None, int | None]] = {}

    def encode(
        self, value: str | None, pending: str | None, pending_at: int | None, at: int
    ) -> bytes:
        key = (value, pending, pending_at, at)
        data = self._encoded.get(key)
        if data is None:
            record = trait_state_to_record(TraitState(value, pending, pending_at, at))
            data = self._codec.encode("TraitState", record)
            if len(self._encoded) < self.LIMIT:
                self._encoded[key] = data
        return data

    def decode(self, data: bytes) -> tuple[str | None, str | None, int | None]:
        fields = self._decoded.get(data)
        if fields is None:
            state = trait_state_from_record(self._codec.decode("TraitState", data))
            fields = (state.value, state.pending, state.pending_at)
            if len(data) <= self.SMALL and len(self._decoded) < self.LIMIT:
                self._decoded[data] = fields
        return fields


def load_state(settings: Settings, spec: TraitSpec) -> tuple[dict[str, StateEntry], int]:
    """This audience's state (user id → entry) and the partition that holds it."""
    records = _StateRecords(make_codec(settings))
    cut = len(spec.key_prefix)
    state: dict[str, StateEntry] = {}

    def on_record(key: bytes, value: bytes | None) -> None:
        user_id = key[cut:].decode()
        if value is None:
            state.pop(user_id, None)
        else:
            state[user_id] = StateEntry(*records.decode(value))

    topic = topics_for(settings).audience_state
    prefix = spec.key_prefix
    partition, _count = read_partition(settings, topic, prefix, on_record, key_prefix=prefix)
    return state, partition


def _check_source(table: ConfigTable, source_id: str) -> None:
    if source_id not in table.sources:
        known = ", ".join(sorted(table.sources)) or "none"
        raise InvalidCall("--source", f"no source has the id {source_id!r}; known: {known}")
    if not table.enabled_destinations(source_id):
        print(
            f"warning: source {source_id!r} has no enabled destination; the router will drop "
            "these calls (state is still recorded)",
            file=sys.stderr,
        )


def sync(
    settings: Settings,
    spec: TraitSpec,
    desired: SyncInput,
    *,
    table: ConfigTable | None = None,
    progress: bool | None = None,
    dry_run: bool = False,
    producer: AckedProducer | None = None,
) -> SyncSummary:
    """Bring receivers from the recorded state to ``desired`` (see the module docstring).

    ``table``: the live config, when the caller already checked the source against it.
    """
    started = time.monotonic()
    # Created first: the idempotent producer's set-up overlaps with reading the state.
    if producer is None and not dry_run:
        producer = AckedProducer(settings)
    if table is None:
        _check_source(load_table(settings), spec.source_id)
    state, partition = load_state(settings, spec)
    summary = SyncSummary(spec, desired, known_users=len(state), dry_run=dry_run)
    changes, summary.counts = diff(desired.values, state, absent=spec.absent)
    del state
    if changes and producer is not None and not dry_run:
        _apply(settings, producer, spec, changes, partition, summary, progress)
    summary.seconds = time.monotonic() - started
    return summary


def _apply(
    settings: Settings,
    producer: AckedProducer,
    spec: TraitSpec,
    changes: list[Change],
    partition: int,
    summary: SyncSummary,
    progress: bool | None,
) -> None:
    codec = make_codec(settings)
    records = _StateRecords(codec)
    topics = topics_for(settings)
    now = now_ms()

    keys = [spec.key(change.user_id) for change in changes]
    # a. mark every change pending; its call's messageId derives from the key, value and time
    for key, change in zip(keys, changes, strict=True):
        at = change.pending_at or now
        mark = records.encode(change.previous, change.value, at, now)
        producer.produce(topics.audience_state, key, mark, partition=partition)
    producer.flush()
    if producer.failed:
        raise BrokerUnavailable(
            f"Kafka refused {len(producer.failed)} state records ({producer.failed[0]}); "
            "no identify call was sent, run the sync again"
        )

    # b. send the identify calls
    producer.reset_counts()
    context = orjson.dumps(
        {
            "personas": {
                "computation_class": _COMPUTATION_CLASS[spec.kind],
                "computation_key": spec.property_name,
                "computation_name": spec.name,
            }
        }
    ).decode()
    bar = tqdm(
        total=len(changes),
        unit=" calls",
        desc="sending",
        disable=None if progress is None else not progress,
        file=sys.stderr,
    )
    try:
        for index, (key, change) in enumerate(zip(keys, changes, strict=True)):
            call = Call(
                type=CallType.IDENTIFY,
                message_id=message_id_for(key, change.value, change.pending_at or now),
                source_id=spec.source_id,
                timestamp=now,
                received_at=now,
                user_id=change.user_id,
                traits=spec.traits_json(change.value),
                context=context,
            )
            producer.produce(topics.calls, call.key, codec.encode("Call", call_to_record(call)))
            if index % 1000 == 999:
                bar.update(1000)
        bar.update(len(changes) - bar.n)
        producer.flush()
    finally:
        bar.close()
    summary.sent = producer.acked
    if producer.failed:
        summary.failed = [str(failure) for failure in producer.failed]
        return  # not confirmed: every user stays uncertain and the next sync sends them again

    # c. confirm: the new value, or a tombstone for false (audience) / null (computed trait)
    for key, change in zip(keys, changes, strict=True):
        confirmed = None
        if change.value != spec.absent:
            confirmed = records.encode(change.value, None, None, now)
        producer.produce(topics.audience_state, key, confirmed, partition=partition)
    producer.flush()
    summary.failed = [str(failure) for failure in producer.failed]


# ---- input and the command line ------------------------------------------------------------------


def _open(path: str) -> tuple[IO[bytes], int | None]:
    if path == "-":
        return sys.stdin.buffer, None
    try:
        stream = open(path, "rb")  # noqa: SIM115 - closed by read_input
        size = Path(path).stat().st_size
    except OSError as exc:
        raise InvalidCall(path, f"cannot be read: {exc.strerror or exc}") from None
    return stream, size


def read_input(path: str, kind: TraitKind, *, progress: bool | None = None) -> SyncInput:
    """Read and validate a whole members or values file (``-``: stdin)."""
    stream, size = _open(path)
    bar = tqdm(
        total=size,
        unit="B",
        unit_scale=True,
        desc="reading",
        disable=None if progress is None else not progress,
        file=sys.stderr,
    )

    def lines() -> Any:
        pending = 0
        for line in stream:
            pending += len(line)
            if pending >= 1 << 20:
                bar.update(pending)
                pending = 0
            yield line
        bar.update(pending)

    label = "stdin" if path == "-" else path
    try:
        if kind is TraitKind.AUDIENCE:
            return read_members(lines(), path=label)
        return read_values(lines(), path=label)
    except OSError as exc:
        raise InvalidCall(label, f"cannot be read: {exc.strerror or exc}") from None
    finally:
        bar.close()
        if stream is not sys.stdin.buffer:
            stream.close()


def _print_summary(summary: SyncSummary, as_json: bool) -> None:
    if as_json:
        print(orjson.dumps(summary.as_json()).decode())
        return
    spec, counts, data = summary.spec, summary.counts, summary.input
    print(
        f"{spec.kind.value} {spec.name!r} (property {spec.property_name}) on source {spec.source_id}: "
        f"{'first sync' if summary.first_sync else 'sync'}{' (dry run)' if summary.dry_run else ''}"
    )
    print(
        f"  users in file: {len(data.values):,} "
        f"(rows {data.rows:,}, duplicates {data.duplicates:,}, blank lines {data.blank:,})"
    )
    changed = f"changed {counts.changed:,}, " if spec.kind is TraitKind.COMPUTED else ""
    resent = f", resent {counts.resent:,} (left uncertain by an interrupted sync)"
    verb = "would send" if summary.dry_run else "sent"
    print(
        f"  added {counts.added:,}, {changed}removed {counts.removed:,}, "
        f"unchanged {counts.unchanged:,}{resent if counts.resent else ''}; "
        f"{verb} {counts.sends if summary.dry_run else summary.sent:,} identify calls "
        f"in {summary.seconds:.1f} s"
    )


def _run(args: argparse.Namespace, settings: Settings, kind: TraitKind, path: str) -> int:
    spec = TraitSpec.of(kind, args.source, args.name)  # ValueError naming --name
    # Created first: the idempotent producer's set-up overlaps with the reads below.
    producer = None if args.dry_run else AckedProducer(settings)
    table = load_table(settings)
    _check_source(table, spec.source_id)
    desired = read_input(path, kind, progress=args.progress)
    if not desired.values and not args.allow_empty:
        raise InvalidCall(
            "stdin" if path == "-" else path,
            "lists no users; syncing it would remove everyone (pass --allow-empty to do that)",
        )
    summary = sync(
        settings,
        spec,
        desired,
        table=table,
        progress=args.progress,
        dry_run=args.dry_run,
        producer=producer,
    )
    _print_summary(summary, args.json)
    if summary.failed:
        print(
            f"error: Kafka refused {len(summary.failed)} records ({summary.failed[0]}); the users "
            "concerned are marked uncertain and the next sync sends them again",
            file=sys.stderr,
        )
        return 1
    return 0


def run_audience_sync(args: argparse.Namespace, settings: Settings) -> int:
    """``pipeline audience sync --source S --name N --members FILE``."""
    return _run(args, settings, TraitKind.AUDIENCE, args.members)


def run_traits_sync(args: argparse.Namespace, settings: Settings) -> int:
    """``pipeline traits sync --source S --name N --values FILE``."""
    return _run(args, settings, TraitKind.COMPUTED, args.values)
