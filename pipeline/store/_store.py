"""The delivery log's store: one database, its schema in place, and over it the writer
(``_writer``: ``write``, ``positions``, ``expire``) and the queries (``_queries``: ``trace``,
``log``, ``stats``, ``hourly``, ``event_names``). Every statement is written once, for SQLite and
PostgreSQL alike.

``LogStore`` is what callers hold: ``open_store(url)`` makes one, and its methods are the
writer's and the queries' under the same names, so a caller needs neither half by name. Here is
what is neither: making and migrating the schema, ``reset`` (which makes it again), the store's
id, and closing.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from ._database import Database
from ._errors import StoreError
from ._models import DestinationStats, EventName, HourFigures, Journey, LogQuery, Trace
from ._queries import LogQueries
from ._schema import MIGRATIONS, SCHEMA_VERSION, TABLE_NAMES, TABLES, ddl
from ._shared_database import SharedDatabase
from ._writer import LogWrite, LogWriter

__all__ = ["LogStore"]


class LogStore:
    """The delivery log in a database. Open with ``open_store(url)``; close when done.

    Safe to share between threads (calls are serialised); open one per process.
    """

    def __init__(self, db: Database) -> None:
        self._db = db
        self._shared = SharedDatabase(db)
        self._writer = LogWriter(self._shared)
        self._queries = LogQueries(self._shared)
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

    # ---- the schema ----------------------------------------------------------------------------

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

    # ---- the writer's --------------------------------------------------------------------------

    def positions(self) -> dict[int, int]:
        """Per Kafka partition: the offset of the next record to apply."""
        return self._writer.positions()

    def write(self, records: Sequence[LogWrite]) -> int:
        """Apply (partition, offset, record) triples in one transaction, each Kafka record once
        (``LogWriter.write``). Returns the number of entries written."""
        return self._writer.write(records)

    def expire(self, before_ms: int) -> int:
        """Delete what is older than ``before_ms`` (``LogWriter.expire``). Returns the number of
        entries deleted."""
        return self._writer.expire(before_ms)

    # ---- the queries' --------------------------------------------------------------------------

    def trace(self, message_id: str) -> Trace | None:
        """Everything about one call; ``None`` if the store never saw it."""
        return self._queries.trace(message_id)

    def log(self, query: LogQuery) -> list[Journey]:
        """Journeys matching every filter of ``query``, newest first by last update."""
        return self._queries.log(query)

    def stats(self, since_ms: int, until_ms: int | None = None) -> list[DestinationStats]:
        """Per destination over [since_ms, until_ms) (``LogQueries.stats``). Problems first."""
        return self._queries.stats(since_ms, until_ms)

    def hourly(self, since_ms: int, until_ms: int | None = None) -> dict[str, list[HourFigures]]:
        """Per destination, per hour of [since_ms, until_ms) (``LogQueries.hourly``)."""
        return self._queries.hourly(since_ms, until_ms)

    def event_names(self, source: str, since_ms: int) -> list[EventName]:
        """Track event names of ``source`` since ``since_ms``, most frequent first."""
        return self._queries.event_names(source, since_ms)
