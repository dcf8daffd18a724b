"""The narrow interface the store's SQL runs on: one connection, one dialect.

The store (``_writer.py``, ``_queries.py``, the schema in ``_store.py``) writes every statement
once, with ``?`` placeholders and SQL both SQLite and PostgreSQL accept (``ON CONFLICT ... DO
UPDATE``, ``CASE``, window functions). A ``Database`` runs it and carries the few differences:

- placeholders (PostgreSQL's driver wants ``%s``), auto-numbered columns and new call ids;
- transactions: SQLite takes the write lock up front (``BEGIN IMMEDIATE``); PostgreSQL locks the
  Kafka partitions' position rows (``FOR UPDATE``) and the schema (an advisory lock);
- bulk inserts and updates: multi-row ``INSERT`` (``... ON CONFLICT DO UPDATE`` for updates) on
  SQLite, ``COPY`` and ``executemany`` on PostgreSQL.
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["Database", "Row"]

Row = tuple[Any, ...]


class Database(abc.ABC):
    """One connection to the store's database. Not thread-safe: the store serialises calls."""

    #: ``sqlite`` or ``postgresql``.
    name: str
    #: The URL for messages, password masked.
    shown_url: str
    #: DDL of an auto-numbered primary key (``calls.call_id``).
    key_column: str
    #: DDL of an auto-numbered column (``entries.id``: entries of one millisecond in order).
    serial_column: str
    #: Appended to the ``SELECT`` of the positions a write is about to move.
    for_update: str = ""

    @abc.abstractmethod
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """Run a statement that returns rows; all of them."""

    @abc.abstractmethod
    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run a statement; the number of rows it changed."""

    @abc.abstractmethod
    def run_many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run a statement once per parameter row."""

    def insert_many(self, table: str, columns: Sequence[str], rows: Sequence[Row]) -> None:
        """Insert ``rows`` (fast path: the backend's bulk insert)."""
        marks = ", ".join("?" * len(columns))
        self.run_many(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)  # noqa: S608

    def update_many(
        self,
        table: str,
        columns: Sequence[str],
        key: Sequence[str],
        changed: Sequence[str],
        rows: Sequence[Row],
    ) -> None:
        """Set the ``changed`` columns of existing rows from ``rows`` (whole rows, in the order of
        ``columns``), found by their ``key`` columns."""
        where = " AND ".join(f"{c} = ?" for c in key)
        sql = f"UPDATE {table} SET {', '.join(f'{c} = ?' for c in changed)} WHERE {where}"  # noqa: S608
        params = operator.itemgetter(*(columns.index(c) for c in (*changed, *key)))
        self.run_many(sql, [params(row) for row in rows])

    @abc.abstractmethod
    def unavailable(self, error: Exception) -> bool:
        """Whether ``error`` means the database cannot be used now but may be soon (a lost
        connection, a lock held too long, a full disk): the store raises ``StoreUnavailable``
        and the caller tries again. Anything else is a bug and stays as it is."""

    @abc.abstractmethod
    def has_table(self, name: str) -> bool:
        """Whether the table exists (the store's schema may not, yet)."""

    @abc.abstractmethod
    def new_call_ids(self, count: int) -> list[int]:
        """``count`` unused call ids, increasing (within a write transaction)."""

    @abc.abstractmethod
    def begin(self, *, write: bool) -> None:
        """Start a transaction; ``write``: one that will write (SQLite takes its lock now).
        A connection lost since the last one is opened again first."""

    @abc.abstractmethod
    def commit(self) -> None: ...

    @abc.abstractmethod
    def rollback(self) -> None: ...

    def lock_schema(self) -> None:  # noqa: B027  (SQLite's write lock does it already)
        """Within a write transaction: keep other processes from creating or dropping the schema
        at the same time."""

    @abc.abstractmethod
    def close(self) -> None: ...
