"""The one database a store's writer and queries work on, and the transactions they run in.

A store holds one connection (``Database``), which is not thread-safe, while the log-store
role writes from its thread and the console reads from others: every call of the writer and of
the queries runs in ``transaction``, which takes the store's lock first, so calls take turns.
The lock is re-entrant: opening the store holds it around both of its transactions.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ._database import Database
from ._errors import StoreUnavailable

__all__ = ["SharedDatabase"]


class SharedDatabase:
    """A ``Database`` behind a lock, used in transactions only."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.lock = threading.RLock()

    @contextmanager
    def transaction(self, *, write: bool) -> Iterator[None]:
        """One transaction, the lock held; the database's "not now" errors become
        ``StoreUnavailable``. ``write``: one that will write (see ``Database.begin``)."""
        with self.lock:
            try:
                self.db.begin(write=write)
                try:
                    yield
                    self.db.commit()
                except BaseException:
                    try:
                        self.db.rollback()
                    except Exception:  # noqa: S110  (the connection may be gone; the first error counts)
                        pass
                    raise
            except StoreUnavailable:
                raise
            except Exception as exc:
                if self.db.unavailable(exc):
                    problem = str(exc).strip() or type(exc).__name__
                    raise StoreUnavailable(self.db.shown_url, problem) from exc
                raise

    def close(self) -> None:
        """Close the connection once no call is using it."""
        with self.lock:
            self.db.close()
