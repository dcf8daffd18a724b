"""``open_store``: the backend a URL names, connected, its schema in place."""

from __future__ import annotations

from ._errors import StoreError
from ._store import LogStore
from ._url import parse_store_url

__all__ = ["open_store", "POSTGRES_INSTALL_HINT"]

POSTGRES_INSTALL_HINT = (
    "pip install 'kafka-webhook-pipeline[postgres]' (this package's postgres extra; "
    "in a checkout: pip install -e '.[postgres]')"
)


def open_store(url: str) -> LogStore:
    """The log store at ``url``, its schema created if missing.

        store = open_store("sqlite:////var/lib/pipeline/log.sqlite3")   # or a bare path
        store = open_store("postgresql://pipeline:secret@db:5432/log")

    Raises ``ValueError`` for a URL of another scheme, ``StoreUnavailable`` when the database
    cannot be reached or opened, ``StoreError`` when psycopg is missing or the schema is newer
    than this version.
    """
    location = parse_store_url(url)
    if location.backend == "sqlite":
        from ._sqlite import SqliteDatabase

        return LogStore(SqliteDatabase(location.url))
    try:
        from ._postgres import PostgresDatabase
    except ImportError as exc:
        raise StoreError(
            f"log store {location.shown}: the PostgreSQL backend needs psycopg 3, which is not "
            f"installed ({exc}): {POSTGRES_INSTALL_HINT}"
        ) from None
    database = PostgresDatabase(location.url)
    try:
        return LogStore(database)
    except BaseException:
        database.close()
        raise
