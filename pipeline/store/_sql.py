"""Pieces of SQL that both the writer and the queries build statements from: placeholder lists,
parameters in chunks, and the call buckets a look-up by user probes (``CALL_BUCKET``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ._database import Database
from ._schema import CALLS_PER_BUCKET

__all__ = ["CHUNK", "call_buckets", "chunks", "marks"]

#: Parameters per ``IN (...)`` list (SQLite allows 32,766 per statement; PostgreSQL 65,535).
CHUNK = 500


def chunks(values: Sequence[Any], size: int = CHUNK) -> Iterator[Sequence[Any]]:
    """``values`` in slices of at most ``size``."""
    for start in range(0, len(values), size):
        yield values[start : start + size]


def marks(count: int) -> str:
    """``count`` placeholders for an ``IN (...)`` list: ``?, ?, ?``."""
    return ", ".join("?" * count)


def call_buckets(db: Database) -> list[int]:
    """Every bucket of the calls held (``CALL_BUCKET``); [-1] when there is none."""
    # Two subqueries: SQLite finds a lone MIN or MAX in the index, both together by a scan.
    ((low, high),) = db.query(
        "SELECT (SELECT MIN(call_id) FROM calls), (SELECT MAX(call_id) FROM calls)"
    )
    if low is None:
        return [-1]
    return list(range(low // CALLS_PER_BUCKET, high // CALLS_PER_BUCKET + 1))
