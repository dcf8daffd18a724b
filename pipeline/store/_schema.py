"""The store's tables and indexes, written once for both backends.

    meta             schema_version, store_id (a random id made with the schema)
    positions        per Kafka partition of deliveries.log: the next offset to apply
    calls            message id → call id (a number given in order of arrival), and the call's
                     user id and anonymous id (``log --user`` and purges look calls up by them)
    entries          one row per LogEntry, by call id: what SQL filters or adds up on in columns
                     (time, kind, destination, status, error, ok, duration), the rest of the
                     entry's set fields as JSON (``detail``)
    journeys         one row per call and destination: the folded state (``log``)
    purges           deletion requests applied: (user id, time of the request)
    purged_messages  message ids a purge removed (not personal data), so that their later
                     entries are not stored again and ``trace`` can say what happened
    event_names      track calls per source, event name and hour (the console's schema page)

Why call ids: message ids are random UUIDs, and every B-tree keyed by one takes each insert on a
random page; at 500 records a write that is a page written per row (measured: a third of the
ingest rate). A call id grows with time, so the entries' and journeys' keys are appended at the
end; only ``calls`` takes random inserts: its message id, user id and anonymous id, once per
call. (On journeys, the user and anonymous id indexes took two per destination, and cost 40 % of
the ingest rate into a store of a million entries.)

Indexes are chosen for the queries and measured (bench/log_store.py): each one costs ingest
rate, so only what a query needs to stay fast at 10 million entries is here.

- ``calls (message_id)`` (unique): trace, and the fold's look-up of a batch's calls.
- ``calls (user_id)``, ``(anonymous_id)``: ``log --user`` (the two are OR-ed; then the calls'
  journeys by primary key) and purges.
- ``entries (call_id)``: trace. ``entries (at)``: stats over a window, and expiry.
- ``journeys`` primary key (call_id, destination): the fold's read-modify-write and trace.
- ``journeys (last_updated)``: ``log`` unfiltered or by time only, and expiry.
- ``journeys (X, last_updated)`` for destination, source, call type and state: a filtered
  ``log`` reads its newest rows straight off the index, however rare the value.
- ``journeys (last_updated) WHERE failed_attempts > 0``: ``log --state failed``.

A later version migrates from ``schema_version`` (``MIGRATIONS``); a store written by a newer
version is refused rather than guessed at.
"""

from __future__ import annotations

__all__ = [
    "CALLS_PER_BUCKET",
    "CALL_BUCKET",
    "SCHEMA_VERSION",
    "TABLES",
    "INDEXES",
    "ENTRY_COLUMNS",
    "JOURNEY_COLUMNS",
    "MIGRATIONS",
    "TABLE_NAMES",
    "ddl",
]

SCHEMA_VERSION = 1

#: Calls per bucket of the user and anonymous id indexes (``CALL_BUCKET``).
CALLS_PER_BUCKET = 4096
#: The bucket of a call: the user and anonymous id indexes lead with it, so that a new call's
#: keys go into the newest bucket's few pages rather than anywhere in a large B-tree; a look-up by
#: user probes every bucket (one seek each: ~400 for 10 million entries).
CALL_BUCKET = f"(call_id / {CALLS_PER_BUCKET})"

ENTRY_COLUMNS = (
    "call_id",
    "at",
    "kind",
    "destination",
    "status",
    "error",
    "ok",
    "duration_ms",
    "detail",
)

JOURNEY_COLUMNS = (
    "call_id",
    "destination",
    "message_id",
    "state",
    "state_at",
    "source",
    "call_type",
    "user_id",
    "anonymous_id",
    "event",
    "first_seen",
    "last_updated",
    "attempts",
    "failed_attempts",
    "last_status",
    "last_error",
    "last_attempt_at",
    "reason",
    "tier",
    "not_before",
    "replay_id",
)

#: ``{key}``: the dialect's auto-numbered primary key; ``{serial}``: an auto-numbered column
#: (entries of one millisecond keep their arrival order by it).
TABLES = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS positions ("
    " kafka_partition INTEGER PRIMARY KEY, next_offset BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS calls ("
    " call_id {key}, message_id TEXT NOT NULL UNIQUE, user_id TEXT, anonymous_id TEXT)",
    "CREATE TABLE IF NOT EXISTS entries ("
    " id {serial}, call_id BIGINT NOT NULL, at BIGINT NOT NULL, kind TEXT NOT NULL,"
    " destination TEXT, status INTEGER, error TEXT, ok SMALLINT, duration_ms INTEGER,"
    " detail TEXT)",
    "CREATE TABLE IF NOT EXISTS journeys ("
    " call_id BIGINT NOT NULL, destination TEXT NOT NULL, message_id TEXT NOT NULL,"
    " state TEXT NOT NULL, state_at BIGINT NOT NULL,"
    " source TEXT, call_type TEXT, user_id TEXT, anonymous_id TEXT, event TEXT,"
    " first_seen BIGINT NOT NULL, last_updated BIGINT NOT NULL,"
    " attempts INTEGER NOT NULL, failed_attempts INTEGER NOT NULL,"
    " last_status INTEGER, last_error TEXT, last_attempt_at BIGINT,"
    " reason TEXT, tier INTEGER, not_before BIGINT, replay_id TEXT,"
    " PRIMARY KEY (call_id, destination))",
    "CREATE TABLE IF NOT EXISTS purges ("
    " user_id TEXT NOT NULL, at BIGINT NOT NULL, PRIMARY KEY (user_id, at))",
    "CREATE TABLE IF NOT EXISTS purged_messages ("
    " message_id TEXT PRIMARY KEY, purged_at BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS event_names ("
    " source TEXT NOT NULL, event TEXT NOT NULL, hour BIGINT NOT NULL,"
    " calls BIGINT NOT NULL, last_seen BIGINT NOT NULL, PRIMARY KEY (source, event, hour))",
)

#: (name, definition): the secondary indexes (the bench drops and rebuilds them for bulk loads).
INDEXES = (
    ("calls_user", f"calls ({CALL_BUCKET}, user_id) WHERE user_id IS NOT NULL"),
    ("calls_anonymous", f"calls ({CALL_BUCKET}, anonymous_id) WHERE anonymous_id IS NOT NULL"),
    ("entries_call", "entries (call_id)"),
    ("entries_at", "entries (at)"),
    ("journeys_updated", "journeys (last_updated)"),
    ("journeys_destination", "journeys (destination, last_updated)"),
    ("journeys_source", "journeys (source, last_updated)"),
    ("journeys_type", "journeys (call_type, last_updated)"),
    ("journeys_state", "journeys (state, last_updated)"),
    ("journeys_failed", "journeys (last_updated) WHERE failed_attempts > 0"),
)

#: Tables in the order ``reset`` drops them.
TABLE_NAMES = (
    "event_names",
    "purged_messages",
    "purges",
    "journeys",
    "entries",
    "calls",
    "positions",
    "meta",
)

#: version → the statements that bring a store of that version to the next one.
MIGRATIONS: dict[int, tuple[str, ...]] = {}


def ddl(key_column: str, serial_column: str) -> list[str]:
    """Every statement that creates the schema (each idempotent)."""
    tables = [t.replace("{key}", key_column).replace("{serial}", serial_column) for t in TABLES]
    return tables + [f"CREATE INDEX IF NOT EXISTS {name} ON {spec}" for name, spec in INDEXES]
