"""The embedded backend: a SQLite file, stdlib ``sqlite3``, nothing to set up.

WAL mode, so readers (``pipeline trace``, the console) never wait for the writer and the writer
never waits for them; ``synchronous=NORMAL`` (a commit is durable once the WAL is checkpointed;
a power cut may lose the last transactions, which the consumer reads again from Kafka because
the positions roll back with them). Several writer processes may share a file: each write takes
the lock up front (``BEGIN IMMEDIATE``) and waits up to ``BUSY_TIMEOUT`` for another.

Checkpoints (copying the WAL into the database file) run on a thread of their own, with its own
connection, from a process's first write until ``close``. SQLite lets a checkpoint run while the
writer appends to the WAL; the writer would otherwise checkpoint on commit every 1,000 pages and
wait for the fsync: measured, a quarter of the ingest rate into a store of a million entries.
The writer still checkpoints itself past ``WAL_LIMIT_PAGES``, should the thread fall behind.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

from ._database import Database, Row
from ._errors import StoreError, StoreUnavailable

__all__ = ["SqliteDatabase", "BUSY_TIMEOUT", "CACHE_MB", "CHECKPOINT_EVERY", "WAL_LIMIT_PAGES"]

log = logging.getLogger("pipeline.store")

#: Seconds a statement waits for another process's lock before it fails.
BUSY_TIMEOUT = 30.0
#: Page cache per connection (memory is taken as pages are read): the calls' message-id index
#: takes inserts at random places, and more of it in memory means fewer reads.
CACHE_MB = 128
#: Seconds between background checkpoints while writes come in.
CHECKPOINT_EVERY = 1.0
#: WAL pages after which a commit checkpoints by itself (SQLite's default is 1,000).
WAL_LIMIT_PAGES = 20_000
#: The WAL file is cut back to this size after a checkpoint emptied it.
WAL_KEEP_BYTES = 64 * 1024 * 1024
#: Rows per ``INSERT ... VALUES (...), (...)`` of ``insert_many`` and ``update_many`` (a power of
#: two; the 21 columns of journeys make 5,376 parameters, under SQLite's 32,766).
ROWS_PER_INSERT = 256
#: Bound in place of ``None``: SQLite stores a NaN as NULL. Binding ``None`` itself costs 374 ns
#: (the module looks for an adapter for it: a tuple, a dict miss and two attribute look-ups, all
#: holding the GIL), a float 40 ns; a row of the store holds several, and no column takes floats
#: (``test_a_nan_is_stored_as_null`` checks SQLite still does this).
_NULL = math.nan


class _Checkpointer:
    """A thread that checkpoints the WAL soon after writes, from its own connection."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-store-checkpoint", daemon=True)
        self._thread.start()

    def written(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        self._thread.join(BUSY_TIMEOUT)

    def _run(self) -> None:
        connection = sqlite3.connect(self._path, timeout=BUSY_TIMEOUT, isolation_level=None)
        try:
            while not self._stopped.is_set():
                self._wake.wait()
                self._wake.clear()
                if self._stopped.is_set():
                    break
                try:
                    connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:  # the writer checkpoints past WAL_LIMIT_PAGES
                    log.warning("log store checkpoint failed: %s", exc)
                self._stopped.wait(CHECKPOINT_EVERY)  # at most one checkpoint per interval
        finally:
            connection.close()


class SqliteDatabase(Database):
    name = "sqlite"
    key_column = "INTEGER PRIMARY KEY"
    serial_column = "INTEGER PRIMARY KEY"

    def __init__(self, path: str) -> None:
        self.shown_url = f"sqlite:///{path}"
        memory = path == ":memory:"
        try:
            if not memory:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._connection = sqlite3.connect(
                path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            raise StoreUnavailable(self.shown_url, str(exc)) from None
        try:
            for pragma in (
                "journal_mode=WAL",
                "synchronous=NORMAL",
                f"busy_timeout={int(BUSY_TIMEOUT * 1000)}",
                f"cache_size=-{CACHE_MB * 1024}",
                "temp_store=MEMORY",
                f"wal_autocheckpoint={WAL_LIMIT_PAGES}",
                f"journal_size_limit={WAL_KEEP_BYTES}",
            ):
                self._connection.execute(f"PRAGMA {pragma}")
        except sqlite3.DatabaseError as exc:
            self._connection.close()
            if isinstance(exc, sqlite3.OperationalError):
                raise StoreUnavailable(self.shown_url, str(exc)) from None
            raise StoreError(f"log store {self.shown_url}: {exc}") from None
        self._cursor = self._connection.cursor()
        self._path = path
        self._writing = False
        self._checkpointer: _Checkpointer | None = None
        self._inserts: dict[tuple[str, tuple[str, ...], int, str], str] = {}

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return self._cursor.execute(sql, params).fetchall()

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._cursor.execute(sql, params).rowcount

    def run_many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self._cursor.executemany(sql, rows)

    def insert_many(self, table: str, columns: Sequence[str], rows: Sequence[Row]) -> None:
        """Multi-row ``INSERT``s of ``ROWS_PER_INSERT`` rows, then of halves down to one row for
        the rest: a handful of statements, each prepared once per connection. ``executemany``
        runs the statement once per row (binding, stepping, resetting it, and letting go of the
        GIL each time): measured, the store's writes took 14-18 % more CPU per record that
        way (batches of 5,000-30,000 log records)."""
        self._insert_rows(table, columns, rows)

    def update_many(
        self,
        table: str,
        columns: Sequence[str],
        key: Sequence[str],
        changed: Sequence[str],
        rows: Sequence[Row],
    ) -> None:
        """As ``insert_many``: multi-row ``INSERT ... ON CONFLICT (key) DO UPDATE`` of the
        ``changed`` columns (every row exists: the conflict is certain, the insert never
        happens)."""
        upsert = f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET " + ", ".join(
            f"{c} = excluded.{c}" for c in changed
        )
        self._insert_rows(table, columns, rows, upsert)

    def _insert_rows(
        self, table: str, columns: Sequence[str], rows: Sequence[Row], then: str = ""
    ) -> None:
        # Older SQLite builds allow 999 parameters a statement, not 32,766.
        limit = self._connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // len(columns)
        size, start, end = ROWS_PER_INSERT, 0, len(rows)
        while size > limit:
            size //= 2
        execute = self._cursor.execute
        while start < end:
            while size > end - start:
                size //= 2
            chunk = chain.from_iterable(rows[start : start + size])
            execute(
                self._insert(table, columns, size, then), [_NULL if v is None else v for v in chunk]
            )
            start += size

    def _insert(self, table: str, columns: Sequence[str], count: int, then: str) -> str:
        key = (table, tuple(columns), count, then)
        sql = self._inserts.get(key)
        if sql is None:
            one = f"({', '.join('?' * len(columns))})"
            values = ", ".join([one] * count)
            sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES {values}{then}"  # noqa: S608
            self._inserts[key] = sql
        return sql

    def unavailable(self, error: Exception) -> bool:
        text = str(error).lower()
        return isinstance(error, sqlite3.OperationalError) and any(
            word in text for word in ("locked", "busy", "disk", "i/o", "unable to open")
        )

    def has_table(self, name: str) -> bool:
        found = self._cursor.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        ).fetchall()
        return bool(found)

    def new_call_ids(self, count: int) -> list[int]:
        # The write lock is held (BEGIN IMMEDIATE): nobody else numbers calls meanwhile.
        (last,) = self._cursor.execute("SELECT COALESCE(MAX(call_id), 0) FROM calls").fetchone()
        return list(range(last + 1, last + 1 + count))

    def begin(self, *, write: bool) -> None:
        self._cursor.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        self._writing = write

    def commit(self) -> None:
        writing = self._connection.in_transaction and self._writing
        self._cursor.execute("COMMIT")
        if writing and self._path != ":memory:":
            if self._checkpointer is None:
                self._checkpointer = _Checkpointer(self._path)
            self._checkpointer.written()

    def rollback(self) -> None:
        if self._connection.in_transaction:
            self._cursor.execute("ROLLBACK")

    def close(self) -> None:
        # No PRAGMA optimize: ANALYZE's per-index averages hide skew (a few waiting journeys
        # among millions) and led the planner astray; the plans without it are measured.
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        self._connection.close()
