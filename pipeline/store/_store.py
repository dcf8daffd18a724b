"""The delivery log's store: ``write`` what the consumer of ``deliveries.log`` reads, answer
``trace``, ``log``, ``stats`` and ``event_names``. One class over a ``Database`` (SQLite or
PostgreSQL); every statement is written once, here.

Why the store is idempotent: each ``write`` is one transaction that also stores, per Kafka
partition, the offset after the last record it applied. A record below that position was applied
already and is skipped, so a consumer that crashed between our commit and its own offset commit
(or that never commits offsets and starts from ``positions()``) changes nothing by reading a
record twice.

Deletion requests (a ``delete`` call with a user id): its ``received`` entry purges the user's
calls first seen before it, entries and journeys, in the same transaction. The purge and the
purged message ids are remembered, so that (a) later entries of a purged call are not stored,
(b) when the topic is read again after ``reset`` and the request comes before older calls of the
user (they were on another partition), those are not stored either, and (c) ``trace`` of a
purged message id says when a deletion removed it. With no purge on record, a write pays two
one-row look-ups for all this.
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from pipeline.core.durations import HOUR_MS
from pipeline.core.log_entries import JourneyState, LogEntry, LogKind, LogRecord

from ._database import Database, Row
from ._errors import StoreError
from ._fold import Batch, JourneyRow, clean, first_at
from ._models import (
    FAILED,
    DestinationStats,
    EventName,
    HourFigures,
    Journey,
    LogQuery,
    Trace,
)
from ._schema import (
    CALL_BUCKET,
    ENTRY_COLUMNS,
    JOURNEY_COLUMNS,
    MIGRATIONS,
    SCHEMA_VERSION,
    TABLE_NAMES,
    TABLES,
    ddl,
)
from ._shared_database import SharedDatabase
from ._sql import call_buckets, chunks, marks

__all__ = ["EXPIRE_CHUNK", "LogStore", "LogWrite"]

#: (Kafka partition, offset, record)
LogWrite = tuple[int, int, LogRecord]

#: Rows ``expire`` deletes per transaction (about 0.1 s on SQLite).
EXPIRE_CHUNK = 20_000
#: Later than any time the store holds (epoch ms), for an open-ended window.
_END_OF_TIME = 2**62

_JOURNEY_LIST = ", ".join(JOURNEY_COLUMNS)
_ENTRY_LIST = ", ".join(ENTRY_COLUMNS)
#: A journey's identity is written when it is made, and again only when a batch fills in a
#: missing part: an UPDATE that names an indexed column (source, call type) maintains that index
#: even when the value is unchanged.
_IDENTITY = ("source", "call_type", "user_id", "anonymous_id", "event")
_STATE_COLUMNS = tuple(c for c in JOURNEY_COLUMNS[3:] if c not in _IDENTITY)
_JOURNEY_KEY = ("call_id", "destination")
_IDENTITY_UPDATE = (
    f"UPDATE journeys SET {', '.join(f'{c} = ?' for c in _IDENTITY)}"  # noqa: S608
    " WHERE call_id = ? AND destination = ?"
)
_identity_params = operator.itemgetter(*(JOURNEY_COLUMNS.index(c) for c in _IDENTITY))


class LogStore:
    """The delivery log in a database. Open with ``open_store(url)``; close when done.

    Safe to share between threads (calls are serialised); open one per process.
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        self._shared = SharedDatabase(db)
        self._store_id = ""
        with self._shared.lock:
            # A read transaction: a reader never waits for the writer's lock.
            with self._shared.transaction(write=False):
                meta = self._meta()
            if meta.get("schema_version") == str(SCHEMA_VERSION) and meta.get("store_id"):
                self._store_id = meta["store_id"]
                return
            with self._shared.transaction(write=True):
                self._create_schema()

    # ---- lifecycle -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """Where the store is, password masked."""
        return self._db.shown_url

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self._db.name

    @property
    def store_id(self) -> str:
        """A random id made when the store's schema was created (a new one after ``reset``).
        The consumer's group id is ``log-store.<store_id>``: a new store reads the topic from
        its start."""
        return self._store_id

    def close(self) -> None:
        self._shared.close()

    def __enter__(self) -> LogStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _meta(self) -> dict[str, str]:
        if not self._db.has_table("meta"):
            return {}
        return dict(self._db.query("SELECT key, value FROM meta"))

    def _create_schema(self) -> None:
        db = self._db
        db.lock_schema()
        db.run(TABLES[0])  # meta first: it says which version the rest is
        existing = self._meta()
        version = int(existing.get("schema_version", SCHEMA_VERSION))
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"log store {db.shown_url} has schema version {version}; this version of the "
                f"pipeline knows up to {SCHEMA_VERSION}: upgrade it (or reset the store)"
            )
        while version < SCHEMA_VERSION:  # later versions: their migrations, in order
            for statement in MIGRATIONS[version]:
                db.run(statement)
            version += 1
        for statement in ddl(db.key_column, db.serial_column):
            db.run(statement)
        store_id = existing.get("store_id") or uuid.uuid4().hex
        db.run_many(
            "INSERT INTO meta (key, value) VALUES (?, ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            [("schema_version", str(version)), ("store_id", store_id)],
        )
        self._store_id = store_id

    def reset(self) -> None:
        """Drop everything and start again with a new ``store_id`` (the rebuild: the consumer
        then reads ``deliveries.log`` from its start)."""
        with self._shared.transaction(write=True):
            self._db.lock_schema()
            for table in TABLE_NAMES:
                self._db.run(f"DROP TABLE IF EXISTS {table}")
            self._create_schema()

    # ---- writing -------------------------------------------------------------------------------

    def positions(self) -> dict[int, int]:
        """Per Kafka partition: the offset of the next record to apply."""
        with self._shared.transaction(write=False):
            return dict(self._db.query("SELECT kafka_partition, next_offset FROM positions"))

    def write(self, records: Sequence[LogWrite]) -> int:
        """Apply (partition, offset, record) triples, in offset order per partition, in one
        transaction; records below their partition's stored position are skipped (applied
        already). The records of one Kafka record (a ``LogBatch``) share its offset and come
        together, once (the caller gives a Kafka record read twice in a row once). Returns the
        number of entries written."""
        if not records:
            return 0
        with self._shared.transaction(write=True):
            return self._write(records)

    def _write(self, records: Sequence[LogWrite]) -> int:
        db = self._db
        partitions = sorted({partition for partition, _offset, _record in records})
        db.run_many(
            "INSERT INTO positions (kafka_partition, next_offset) VALUES (?, 0)"
            " ON CONFLICT (kafka_partition) DO NOTHING",
            [(p,) for p in partitions],
        )
        stored: dict[int, int] = dict(
            db.query(
                "SELECT kafka_partition, next_offset FROM positions"  # noqa: S608
                f" WHERE kafka_partition IN ({marks(len(partitions))}){db.for_update}",
                partitions,
            )
        )
        next_offsets = dict(stored)
        accepted: list[LogRecord] = []
        # A Kafka record of the log holds several log records (a LogBatch): they come one after
        # another with its offset. The same Kafka record again later in the call (read twice: a
        # partition taken back) is applied once.
        seen: set[tuple[int, int]] = set()
        current, again = (-1, -1), False
        for partition, offset, record in records:
            if offset < stored[partition]:
                continue  # applied already
            if (partition, offset) != current:
                current = (partition, offset)
                again = current in seen
                seen.add(current)
            if again:
                continue
            if offset >= next_offsets[partition]:
                next_offsets[partition] = offset + 1
            if record.entries:
                accepted.append(record)
        if accepted and self._any_purges():
            accepted = self._without_purged(accepted)
        batch = Batch(*self._calls(_identities(accepted)))
        for record in accepted:
            batch.add(record)
        if batch.entries:
            db.insert_many("entries", ENTRY_COLUMNS, batch.entries)
        self._store_journeys(batch)
        if batch.event_names:
            db.run_many(
                "INSERT INTO event_names (source, event, hour, calls, last_seen)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (source, event, hour) DO UPDATE SET"
                " calls = event_names.calls + excluded.calls,"
                " last_seen = CASE WHEN excluded.last_seen > event_names.last_seen"
                " THEN excluded.last_seen ELSE event_names.last_seen END",
                [(*key, *counted) for key, counted in sorted(batch.event_names.items())],
            )
        for user_id, at in batch.purges:
            self._purge(user_id, at)
        db.run_many(
            "UPDATE positions SET next_offset = ? WHERE kafka_partition = ?",
            [(n, p) for p, n in sorted(next_offsets.items()) if n != stored[p]],
        )
        return len(batch.entries)

    def _calls(
        self, calls: dict[str, tuple[str | None, str | None]]
    ) -> tuple[dict[str, int], dict[tuple[int, str], JourneyRow]]:
        """The call id of each message id in ``calls`` (message id → user id, anonymous id), and
        the journeys stored for them, in one look-up. New calls get the next ids, in arrival
        order; a known call's missing user or anonymous id is filled in."""
        found: dict[str, int] = {}
        journeys: dict[tuple[int, str], JourneyRow] = {}
        filled = []
        for chunk in chunks(sorted(calls)):
            for message_id, call_id, user_id, anonymous_id, *journey in self._db.query(
                "SELECT c.message_id, c.call_id, c.user_id, c.anonymous_id, "  # noqa: S608
                f"{', '.join('j.' + c for c in JOURNEY_COLUMNS)} FROM calls AS c"
                " LEFT JOIN journeys AS j ON j.call_id = c.call_id"
                f" WHERE c.message_id IN ({marks(len(chunk))})",
                chunk,
            ):
                if journey[0] is not None:
                    journeys[(call_id, journey[1])] = JourneyRow(*journey)
                if message_id in found:
                    continue
                found[message_id] = call_id
                user, anonymous = calls[message_id]
                if (user and not user_id) or (anonymous and not anonymous_id):
                    filled.append((user, anonymous, call_id))
        if filled:
            self._db.run_many(
                "UPDATE calls SET user_id = COALESCE(user_id, ?),"
                " anonymous_id = COALESCE(anonymous_id, ?) WHERE call_id = ?",
                filled,
            )
        new = sorted(calls.keys() - found.keys())
        if new:
            rows = [
                (call_id, message_id, *calls[message_id])
                for call_id, message_id in zip(self._db.new_call_ids(len(new)), new, strict=True)
            ]
            self._db.insert_many(
                "calls", ("call_id", "message_id", "user_id", "anonymous_id"), rows
            )
            found.update((message_id, call_id) for call_id, message_id, _u, _a in rows)
        return found, journeys

    def _store_journeys(self, batch: Batch) -> None:
        new, updated, identified = [], [], []
        for key in sorted(batch.touched):  # one order in every process: no deadlocks
            row = batch.journeys[key].params()
            if key in batch.new:
                new.append(row)
                continue
            updated.append(row)
            if key in batch.identified:
                identified.append((*_identity_params(row), *key))
        if new:
            self._db.insert_many("journeys", JOURNEY_COLUMNS, new)
        if updated:
            self._db.update_many("journeys", JOURNEY_COLUMNS, _JOURNEY_KEY, _STATE_COLUMNS, updated)
        if identified:
            self._db.run_many(_IDENTITY_UPDATE, identified)

    # ---- deletion requests ---------------------------------------------------------------------

    def _any_purges(self) -> bool:
        return bool(
            self._db.query("SELECT 1 FROM purges LIMIT 1")
            or self._db.query("SELECT 1 FROM purged_messages LIMIT 1")
        )

    def _without_purged(self, records: list[LogRecord]) -> list[LogRecord]:
        """``records`` without those of purged calls (a), nor those of a purged user older
        than the purge (b); the latter are remembered as purged too."""
        db = self._db
        purged: dict[str, int] = {}
        for chunk in chunks(sorted({clean(r.message_id) for r in records})):
            purged.update(
                db.query(
                    "SELECT message_id, purged_at FROM purged_messages"  # noqa: S608
                    f" WHERE message_id IN ({marks(len(chunk))})",
                    chunk,
                )
            )
        purge_at: dict[str, int] = {}
        for chunk in chunks(sorted({clean(r.user_id) for r in records if r.user_id})):
            purge_at.update(
                db.query(
                    "SELECT user_id, MAX(at) FROM purges"  # noqa: S608
                    f" WHERE user_id IN ({marks(len(chunk))}) GROUP BY user_id",
                    chunk,
                )
            )
        kept, newly = [], []
        for record in records:
            message_id = clean(record.message_id)
            if message_id in purged:
                continue
            at = purge_at.get(clean(record.user_id)) if record.user_id else None
            if at is not None and first_at(record) < at:
                purged[message_id] = at
                newly.append((message_id, at))
                continue
            kept.append(record)
        self._remember_purged(newly)
        # A call's records may come in any order: what arrived before its ``received`` (which
        # names the user) goes with it.
        for chunk in chunks(sorted({message_id for message_id, _at in newly})):
            rows = db.query(
                f"SELECT call_id FROM calls WHERE message_id IN ({marks(len(chunk))})",  # noqa: S608
                chunk,
            )
            self._delete_calls([call_id for (call_id,) in rows])
        return kept

    def _remember_purged(self, purged: Iterable[tuple[str, int]]) -> None:
        self._db.run_many(
            "INSERT INTO purged_messages (message_id, purged_at) VALUES (?, ?)"
            " ON CONFLICT (message_id) DO NOTHING",
            purged,
        )

    def _purge(self, user_id: str, at: int) -> None:
        """Delete the calls of ``user_id`` first seen before ``at``; remember the purge."""
        db = self._db
        db.run(
            "INSERT INTO purges (user_id, at) VALUES (?, ?) ON CONFLICT (user_id, at) DO NOTHING",
            (user_id, at),
        )
        buckets = call_buckets(db)
        calls = db.query(
            "SELECT DISTINCT call_id, message_id FROM journeys WHERE call_id IN ("  # noqa: S608
            f" SELECT call_id FROM calls WHERE {CALL_BUCKET} IN ({marks(len(buckets))})"
            " AND user_id = ?) AND first_seen < ?",
            (*buckets, user_id, at),
        )
        for chunk in chunks(calls):
            self._remember_purged((message_id, at) for _call_id, message_id in chunk)
            self._delete_calls([call_id for call_id, _message_id in chunk])

    def _delete_calls(self, ids: Sequence[int]) -> None:
        """Delete every row of the calls ``ids`` (at most a chunk of them)."""
        if not ids:
            return
        listed = marks(len(ids))
        for table in ("entries", "journeys", "calls"):
            self._db.run(f"DELETE FROM {table} WHERE call_id IN ({listed})", ids)  # noqa: S608

    # ---- retention -----------------------------------------------------------------------------

    def expire(self, before_ms: int) -> int:
        """Delete entries from before ``before_ms``, journeys last updated before it, and purges
        and event counts older than it. Returns the number of entries deleted.

        In transactions of about ``EXPIRE_CHUNK`` rows: a day to expire at once (after a long
        stop) would otherwise hold SQLite's write lock for seconds (7 s for 1.3 million entries,
        measured), and other writers wait at most ``BUSY_TIMEOUT``."""
        deleted = 0
        for table, column in (("entries", "at"), ("journeys", "last_updated")):
            while True:
                with self._shared.transaction(write=True):
                    # The EXPIRE_CHUNK-th oldest row before the limit, if there are that many.
                    cut = self._db.query(
                        f"SELECT {column} FROM {table} WHERE {column} < ?"  # noqa: S608
                        f" ORDER BY {column} LIMIT 1 OFFSET ?",
                        (before_ms, EXPIRE_CHUNK - 1),
                    )
                    if cut:
                        condition, value = f"{column} <= ?", cut[0][0]
                    else:
                        condition, value = f"{column} < ?", before_ms
                    count = self._db.run(f"DELETE FROM {table} WHERE {condition}", (value,))  # noqa: S608
                    if table == "entries":
                        deleted += count
                if not cut:
                    break
        with self._shared.transaction(write=True):
            db = self._db
            db.run("DELETE FROM purges WHERE at < ?", (before_ms,))
            db.run("DELETE FROM purged_messages WHERE purged_at < ?", (before_ms,))
            db.run("DELETE FROM event_names WHERE hour <= ?", (before_ms - HOUR_MS,))
            # Call ids grow with time: a call below every remaining one has nothing left.
            db.run(
                "DELETE FROM calls WHERE call_id < COALESCE((SELECT MIN(call_id) FROM ("
                " SELECT MIN(call_id) AS call_id FROM journeys"
                " UNION ALL SELECT MIN(call_id) FROM entries) AS remaining),"
                " (SELECT MAX(call_id) + 1 FROM calls))"
            )
        return deleted

    # ---- queries -------------------------------------------------------------------------------

    def trace(self, message_id: str) -> Trace | None:
        """Everything about one call; ``None`` if the store never saw it."""
        message_id = clean(message_id)
        with self._shared.transaction(write=False):
            call = self._db.query("SELECT call_id FROM calls WHERE message_id = ?", (message_id,))
            call_id = call[0][0] if call else -1
            entries = self._db.query(
                f"SELECT {_ENTRY_LIST} FROM entries WHERE call_id = ? ORDER BY at, id",  # noqa: S608
                (call_id,),
            )
            journeys = self._db.query(
                f"SELECT {_JOURNEY_LIST} FROM journeys WHERE call_id = ?"  # noqa: S608
                " ORDER BY destination",
                (call_id,),
            )
            purged = self._db.query(
                "SELECT purged_at FROM purged_messages WHERE message_id = ?", (message_id,)
            )
        if not (entries or journeys or purged):
            return None
        states = tuple(_journey(row) for row in journeys)

        def known(name: str) -> Any:
            return next((v for j in states if (v := getattr(j, name)) is not None), None)

        return Trace(
            message_id=message_id,
            source=known("source"),
            call_type=known("call_type"),
            user_id=known("user_id"),
            anonymous_id=known("anonymous_id"),
            event=known("event"),
            entries=tuple(_entry(row) for row in entries),
            destinations=states,
            purged_at=purged[0][0] if purged else None,
        )

    def log(self, query: LogQuery) -> list[Journey]:
        """Journeys matching every filter of ``query``, newest first by last update."""
        with self._shared.transaction(write=False):
            where, params = self._log_filters(query)
            condition = f" WHERE {' AND '.join(where)}" if where else ""
            rows = self._db.query(
                f"SELECT {_JOURNEY_LIST} FROM journeys{condition}"  # noqa: S608
                " ORDER BY last_updated DESC, call_id DESC, destination LIMIT ?",
                [*params, query.limit],
            )
        return [_journey(row) for row in rows]

    def _log_filters(self, query: LogQuery) -> tuple[list[str], list[Any]]:
        """The conditions on journeys of ``query``, and their parameters."""
        where: list[str] = []
        params: list[Any] = []
        for column, value in (
            ("destination", query.destination),
            ("source", query.source),
            ("call_type", query.call_type),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(clean(value))
        if query.user is not None:
            # Through calls (indexed by both ids, bucket by bucket), then each call's journeys
            # by primary key.
            buckets = call_buckets(self._db)
            listed = marks(len(buckets))
            where.append(
                f"call_id IN (SELECT call_id FROM calls WHERE {CALL_BUCKET} IN ({listed})"  # noqa: S608
                f" AND user_id = ? UNION SELECT call_id FROM calls WHERE {CALL_BUCKET} IN ({listed})"
                " AND anonymous_id = ?)"
            )
            user = clean(query.user)
            params += [*buckets, user, *buckets, user]
        if query.state == FAILED:
            where.append("failed_attempts > 0")
        elif query.state is not None:
            where.append("state = ?")
            params.append(query.state)
        if query.since_ms is not None:
            where.append("last_updated >= ?")
            params.append(query.since_ms)
        if query.until_ms is not None:
            where.append("last_updated < ?")
            params.append(query.until_ms)
        return where, params

    def stats(self, since_ms: int, until_ms: int | None = None) -> list[DestinationStats]:
        """Per destination over [since_ms, until_ms): attempts, deliveries, failures, attempt
        durations, the last error, dead letters; and the calls waiting now. Problems first."""
        window = (since_ms, _END_OF_TIME if until_ms is None else until_ms)
        with self._shared.transaction(write=False):
            counts = self._db.query(
                "SELECT destination,"
                " SUM(CASE WHEN kind = 'attempt' THEN 1 ELSE 0 END),"
                " SUM(CASE WHEN kind = 'attempt' THEN ok ELSE 0 END),"
                " SUM(CASE WHEN kind = 'delivered' THEN 1 ELSE 0 END),"
                " SUM(CASE WHEN kind = 'dead_lettered' THEN 1 ELSE 0 END)"
                " FROM entries WHERE at >= ? AND at < ?"
                " AND kind IN ('attempt', 'delivered', 'dead_lettered') AND destination IS NOT NULL"
                " GROUP BY destination",
                window,
            )
            # Nearest rank: the value at rank ceil(p * n / 100), in integer arithmetic.
            percentiles = dict(
                (d, (p50, p95))
                for d, p50, p95 in self._db.query(
                    "SELECT destination,"
                    " MAX(CASE WHEN r = (n * 50 + 99) / 100 THEN duration_ms END),"
                    " MAX(CASE WHEN r = (n * 95 + 99) / 100 THEN duration_ms END)"
                    " FROM (SELECT destination, duration_ms,"
                    " ROW_NUMBER() OVER (PARTITION BY destination ORDER BY duration_ms) AS r,"
                    " COUNT(*) OVER (PARTITION BY destination) AS n"
                    " FROM entries WHERE at >= ? AND at < ? AND kind = 'attempt'"
                    " AND destination IS NOT NULL) AS ranked"
                    " GROUP BY destination",
                    window,
                )
            )
            errors = {
                d: (error, status, at)
                for d, error, status, at in self._db.query(
                    "SELECT destination, error, status, at FROM (SELECT destination, error,"
                    " status, at, ROW_NUMBER() OVER (PARTITION BY destination"
                    " ORDER BY at DESC, id DESC) AS r"
                    " FROM entries WHERE at >= ? AND at < ? AND kind = 'attempt' AND ok = 0"
                    " AND destination IS NOT NULL) AS latest WHERE r = 1",
                    window,
                )
            }
            # Grouped by an expression, so that no index can serve the grouping: else SQLite,
            # with ANALYZE's averages (which hide how rare "waiting" is), scans every journey
            # by destination (4 s at 10 million entries) instead of the few waiting ones.
            waiting: dict[str, int] = dict(
                self._db.query(
                    "SELECT destination || '', COUNT(*) FROM journeys WHERE state = ?"
                    " GROUP BY destination || ''",
                    (JourneyState.WAITING.value,),
                )
            )
        figures: dict[str, tuple[int, int, int, int]] = {
            d: (int(a or 0), int(ok or 0), int(dl or 0), int(dead or 0))
            for d, a, ok, dl, dead in counts
        }
        found = []
        for destination in sorted(figures.keys() | waiting.keys()):
            attempts, succeeded, delivered, dead = figures.get(destination, (0, 0, 0, 0))
            p50, p95 = percentiles.get(destination, (None, None))
            error, status, error_at = errors.get(destination, (None, None, None))
            found.append(
                DestinationStats(
                    destination=destination,
                    attempts=attempts,
                    delivered=delivered,
                    failed=attempts - succeeded,
                    success_ratio=succeeded / attempts if attempts else None,
                    p50_ms=p50,
                    p95_ms=p95,
                    last_error=error,
                    last_error_status=status,
                    last_error_at=error_at,
                    waiting=int(waiting.get(destination, 0)),
                    dead_lettered=dead,
                )
            )
        found.sort(
            key=lambda s: (
                1.0 if s.success_ratio is None else s.success_ratio,
                -s.dead_lettered,
                -s.waiting,
                s.destination,
            )
        )
        return found

    def hourly(self, since_ms: int, until_ms: int | None = None) -> dict[str, list[HourFigures]]:
        """Per destination, per hour of [since_ms, until_ms) that has any: deliveries, failed
        attempts and dead letters (the console's 24-hour charts). Hours start on the hour (UTC)."""
        window = (since_ms, _END_OF_TIME if until_ms is None else until_ms)
        with self._shared.transaction(write=False):
            rows = self._db.query(
                "SELECT destination, at / ? AS hour,"
                " SUM(CASE WHEN kind = 'delivered' THEN 1 ELSE 0 END),"
                " SUM(CASE WHEN kind = 'attempt' AND ok = 0 THEN 1 ELSE 0 END),"
                " SUM(CASE WHEN kind = 'dead_lettered' THEN 1 ELSE 0 END)"
                " FROM entries WHERE at >= ? AND at < ?"
                " AND kind IN ('attempt', 'delivered', 'dead_lettered') AND destination IS NOT NULL"
                " GROUP BY 1, 2 ORDER BY 1, 2",
                (HOUR_MS, *window),
            )
        found: dict[str, list[HourFigures]] = {}
        for destination, hour, delivered, failed, dead in rows:
            found.setdefault(destination, []).append(
                HourFigures(
                    int(hour) * HOUR_MS, int(delivered or 0), int(failed or 0), int(dead or 0)
                )
            )
        return found

    def event_names(self, source: str, since_ms: int) -> list[EventName]:
        """Track event names of ``source`` since ``since_ms``, most frequent first: (name, calls,
        last seen). Counted per hour: the hour that holds ``since_ms`` counts in full."""
        with self._shared.transaction(write=False):
            rows = self._db.query(
                "SELECT event, SUM(calls) AS total, MAX(last_seen) FROM event_names"
                " WHERE source = ? AND hour >= ? GROUP BY event ORDER BY total DESC, event",
                (clean(source), since_ms - since_ms % HOUR_MS),
            )
        return [EventName(name, int(calls), last) for name, calls, last in rows]


def _identities(records: Sequence[LogRecord]) -> dict[str, tuple[str | None, str | None]]:
    """Message id → (user id, anonymous id), the first of each the records give."""
    found: dict[str, tuple[str | None, str | None]] = {}
    for record in records:
        message_id = clean(record.message_id)
        user, anonymous = found.get(message_id, (None, None))
        if user is None and record.user_id:
            user = clean(record.user_id)
        if anonymous is None and record.anonymous_id:
            anonymous = clean(record.anonymous_id)
        found[message_id] = (user, anonymous)
    return found


def _journey(row: Row) -> Journey:
    (
        _call_id,
        destination,
        message_id,
        state,
        _state_at,
        source,
        call_type,
        user_id,
        anonymous_id,
        event,
        first_seen,
        last_updated,
        attempts,
        failed_attempts,
        last_status,
        last_error,
        _last_attempt_at,
        reason,
        tier,
        not_before,
        replay_id,
    ) = row
    return Journey(
        message_id=message_id,
        destination=destination,
        state=JourneyState(state),
        source=source,
        call_type=call_type,
        user_id=user_id,
        anonymous_id=anonymous_id,
        event=event,
        first_seen=first_seen,
        last_updated=last_updated,
        attempts=attempts,
        failed_attempts=failed_attempts,
        last_status=last_status,
        last_error=last_error,
        reason=reason,
        tier=tier,
        not_before=not_before,
        replay_id=replay_id,
    )


def _entry(row: Row) -> LogEntry:
    _call_id, at, kind, destination, status, error, _ok, duration_ms, detail = row
    extra: dict[str, Any] = orjson.loads(detail) if detail else {}
    return LogEntry(
        kind=LogKind(kind),
        at=at,
        destination=destination or "",
        destinations=tuple(extra.get("destinations", ())),
        reason=extra.get("reason", ""),
        size=extra.get("size", 0),
        url=extra.get("url", ""),
        status=status,
        error=error or "",
        duration_ms=duration_ms or 0,
        tier=extra.get("tier", -1),
        not_before=extra.get("not_before", 0),
        attempt=extra.get("attempt", 0),
        response=extra.get("response", ""),
        replay_id=extra.get("replay_id", ""),
        body=extra.get("body"),
    )
