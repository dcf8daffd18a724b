"""Writing the delivery log: ``write`` what the consumer of ``deliveries.log`` reads, and
``expire`` what is older than the retention.

Why the writer is idempotent: each ``write`` is one transaction that also stores, per Kafka
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
from collections.abc import Iterable, Sequence

from pipeline.core.durations import HOUR_MS
from pipeline.core.log_entries import LogRecord

from ._fold import Batch, JourneyRow, clean, first_at
from ._schema import CALL_BUCKET, ENTRY_COLUMNS, JOURNEY_COLUMNS
from ._shared_database import SharedDatabase
from ._sql import call_buckets, chunks, marks

__all__ = ["EXPIRE_CHUNK", "LogWrite", "LogWriter"]

#: (Kafka partition, offset, record)
LogWrite = tuple[int, int, LogRecord]

#: Rows ``expire`` deletes per transaction (about 0.1 s on SQLite).
EXPIRE_CHUNK = 20_000

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


class LogWriter:
    """What changes the log: records in (``write``), old rows out (``expire``). Each method runs
    in transactions of its own on the store's ``SharedDatabase``."""

    def __init__(self, shared: SharedDatabase) -> None:
        self._shared = shared
        self._db = shared.db

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
