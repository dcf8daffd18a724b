"""The delivery log's store: every decision about a call, queryable (``pipeline trace``, ``log``,
``stats``, the console).

    from pipeline.store import LogQuery, open_store

    store = open_store("sqlite:////var/lib/pipeline/log.sqlite3")   # or postgresql://...
    store.write([(partition, offset, record), ...])   # the consumer of deliveries.log
    store.trace("3f2a...")                            # one call, entry by entry
    store.log(LogQuery(destination="crm", state="failed"))
    store.stats(since_ms=now - 3_600_000)
    store.close()

SQLite (stdlib, a local file, the default) and PostgreSQL (psycopg 3) behave the same; the URL
picks one. Text for a terminal is in ``pipeline.store.format``.
"""

from __future__ import annotations

from ._errors import StoreError, StoreUnavailable
from ._models import (
    FAILED,
    LOG_STATES,
    DestinationStats,
    EventName,
    HourFigures,
    Journey,
    LogQuery,
    Trace,
)
from ._open import open_store
from ._schema import SCHEMA_VERSION
from ._store import LogStore
from ._url import masked_url
from ._writer import LogWrite
from .format import format_log, format_stats, format_trace, trace_link

__all__ = [
    "FAILED",
    "LOG_STATES",
    "SCHEMA_VERSION",
    "DestinationStats",
    "EventName",
    "HourFigures",
    "Journey",
    "LogQuery",
    "LogStore",
    "LogWrite",
    "StoreError",
    "StoreUnavailable",
    "Trace",
    "format_log",
    "format_stats",
    "format_trace",
    "trace_link",
    "masked_url",
    "open_store",
]
