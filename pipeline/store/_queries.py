"""Answering questions about the delivery log: ``trace`` (one call), ``log`` (journeys by
filter), ``stats`` and ``hourly`` (per destination), ``event_names`` (per source).

Each question is one read transaction, so its statements read one snapshot of the log (SQLite's
WAL, PostgreSQL's ``REPEATABLE READ``) and no other process's writer holds it up. Rows become the
models of ``_models`` after the transaction, outside the store's lock. Text from outside is
matched as the writer stored it (``clean``).
"""

from __future__ import annotations

from typing import Any

import orjson

from pipeline.core.durations import HOUR_MS
from pipeline.core.log_entries import JourneyState, LogEntry, LogKind

from ._database import Row
from ._fold import clean
from ._models import (
    FAILED,
    DestinationStats,
    EventName,
    HourFigures,
    Journey,
    LogQuery,
    Trace,
)
from ._schema import CALL_BUCKET, ENTRY_COLUMNS, JOURNEY_COLUMNS
from ._shared_database import SharedDatabase
from ._sql import call_buckets, marks

__all__ = ["LogQueries"]

#: Later than any time the store holds (epoch ms), for an open-ended window.
_END_OF_TIME = 2**62

_JOURNEY_LIST = ", ".join(JOURNEY_COLUMNS)
_ENTRY_LIST = ", ".join(ENTRY_COLUMNS)


class LogQueries:
    """The reads of a store. Each method is one read transaction on the store's
    ``SharedDatabase``; none changes anything."""

    def __init__(self, shared: SharedDatabase) -> None:
        self._shared = shared
        self._db = shared.db

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
        trace_id=extra.get("trace_id", ""),
    )
