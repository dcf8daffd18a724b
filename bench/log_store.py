"""The delivery log's store: ingest rate, query times at 10 million entries, disk per attempt.

    .venv/bin/python -m bench.log_store                          # SQLite, 10,000,000 entries
    .venv/bin/python -m bench.log_store --rows 1000000 --backend postgresql
    .venv/bin/python -m bench.log_store --ingest-only             # (1) alone, no big store

1. ``write()`` ingest rate, log records/s, batches of ``--batch`` (500) records in topic order:
   each call's routed record (received + routed), then, a few hundred records later, one attempt
   record per destination (attempt + delivered; some retried, some dead-lettered). Into an empty
   store, and into a copy of the big store of (2). Target: ≥ 20,000 records/s on SQLite.
2. A store of ``--rows`` entries (default 10,000,000) over the last 7 days: 20 destinations,
   5 sources (4 to 8 destinations each, 1 to 3 per call), 100,000 users, most calls delivered
   first time, 5 % retried, 1 % dead-lettered, 1 % dropped. Built from the same records through
   the store's own fold, bulk-inserted with the indexes dropped, then indexed (about 4 minutes for
   10 M on this machine; cached under bench/.cache/ per row count and schema). Then: ``trace``
   of random calls (target < 50 ms), ``log`` with each filter (< 200 ms), ``stats`` over the last
   hour (< 500 ms): the median of ``--runs`` runs, and the slowest run.
3. Disk: bytes per million attempts (database size / attempts in it).

PostgreSQL: a throwaway server started as the tests start it (``tests/pg_server.py``, fsync off),
stopped by PID at the end; its store is built fresh each run (no cache) and ANALYZEd, as
autovacuum would.
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pipeline.core.durations import HOUR_MS
from pipeline.core.log_entries import LogEntry, LogKind, LogRecord
from pipeline.store import SCHEMA_VERSION, LogQuery, LogStore, open_store
from pipeline.store._fold import Batch
from pipeline.store._schema import ENTRY_COLUMNS, INDEXES, JOURNEY_COLUMNS, TABLES
from pipeline.store._writer import _identities

CACHE = Path(__file__).resolve().parent / ".cache"
DAY_MS = 24 * HOUR_MS
SPAN_MS = 7 * DAY_MS
DESTINATIONS = [f"dest-{i:02d}" for i in range(20)]
SOURCES = [f"source-{i}" for i in range(5)]
EVENTS = [
    "Order Completed",
    "Product Viewed",
    "Product Added",
    "Checkout Started",
    "Signed Up",
    "Signed In",
    "Page Scrolled",
    "Video Played",
    "Search Performed",
    "Coupon Applied",
]
#: 70 % track, 15 % identify, 10 % page, 3 % screen, 1 % group, 1 % alias
CALL_TYPES = (
    ["track"] * 70 + ["identify"] * 15 + ["page"] * 10 + ["screen"] * 3 + ["group", "alias"]
)
USERS = 100_000
PARTITIONS = 6


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---- the workload --------------------------------------------------------------------------------


class Workload:
    """Realistic calls, deterministic for a seed: ``call(at)`` → [(time, record), ...]."""

    def __init__(self, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        rng = self.rng
        # each source feeds 4 to 8 destinations; some destinations are much busier than others
        self.routes = {
            s: rng.sample(DESTINATIONS[: 8 + 3 * i], rng.randint(4, 8))
            for i, s in enumerate(SOURCES)
        }
        self.source_weights = [40, 25, 20, 10, 5]

    def message_id(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def call(self, at: int, end: int) -> list[tuple[int, LogRecord]]:
        """One call's records at ``at``; nothing of it happens at or after ``end``."""
        rng = self.rng
        message_id = self.message_id()
        source = rng.choices(SOURCES, self.source_weights)[0]
        call_type = rng.choice(CALL_TYPES)
        # 1 % of the calls come from one busy user (a server-side job), the rest from 100,000
        # users, some much more active than others; a fifth of the calls are anonymous.
        user_number = 0 if rng.random() < 0.01 else 1 + int(USERS * rng.random() ** 2)
        user = f"user-{user_number}" if rng.random() < 0.8 else None
        anonymous = f"anon-{user_number:06d}-{rng.getrandbits(16):04x}"
        event = rng.choice(EVENTS) if call_type == "track" else None

        def record(*entries: LogEntry) -> LogRecord:
            return LogRecord(message_id, source, call_type, user, anonymous, event, entries)

        received = LogEntry(LogKind.RECEIVED, at, size=rng.randint(300, 3000))
        if rng.random() < 0.01:
            return [
                (at, record(received, LogEntry(LogKind.DROPPED, at + 1, reason="no_destination")))
            ]
        destinations = tuple(rng.sample(self.routes[source], rng.choice((1, 1, 2, 2, 2, 3))))
        found = [
            (at, record(received, LogEntry(LogKind.ROUTED, at + 1, destinations=destinations)))
        ]
        for destination in destinations:
            url = f"https://{destination}.example.com/hooks/analytics"
            t = at + rng.randint(5, 200)
            if t >= end:  # still in flight
                continue
            duration = min(int(rng.lognormvariate(4.0, 0.6)), 5000)
            fate = rng.random()
            if fate < 0.93:
                found.append((t, record(*attempt(destination, url, t, 200, "", duration, 1))))
                continue
            if fate < 0.99:  # retried: a 503 or a timeout, then delivered 10 s later
                status, error = (503, "server_error") if fate < 0.97 else (None, "timeout")
                entries = attempt(destination, url, t, status, error, duration, 1, retry=10_000)
                found.append((t, record(*entries)))
                if t + 10_000 < end:
                    later = t + 10_000 + rng.randint(0, 50)
                    found.append(
                        (later, record(*attempt(destination, url, later, 200, "", duration, 2)))
                    )
                continue
            found.append(
                (t, record(*attempt(destination, url, t, 400, "client_error", duration, 1)))
            )
        return found


def attempt(
    destination: str,
    url: str,
    at: int,
    status: int | None,
    error: str,
    duration: int,
    number: int,
    retry: int = 0,
) -> tuple[LogEntry, ...]:
    """An attempt and its conclusion: delivered, retry_scheduled (``retry`` ms), dead_lettered."""
    tried = LogEntry(
        LogKind.ATTEMPT,
        at,
        destination=destination,
        url=url,
        status=status,
        error=error,
        duration_ms=duration,
        attempt=number,
        tier=-1 if number == 1 else 0,
        response="" if not error else '{"error":"upstream unavailable, try again later"}',
    )
    done = at + duration
    if not error:
        return tried, LogEntry(LogKind.DELIVERED, done, destination=destination)
    if retry:
        return tried, LogEntry(
            LogKind.RETRY_SCHEDULED, done, destination=destination, tier=0, not_before=done + retry
        )
    return tried, LogEntry(LogKind.DEAD_LETTERED, done, destination=destination, reason=error)


def topic_order(
    workload: Workload, start: int, calls_per_s: float, count: int
) -> Iterator[LogRecord]:
    """``count`` calls' records in the order the log topic would hold them (by time)."""
    pending: list[tuple[int, int, LogRecord]] = []
    step = 1000 / calls_per_s
    sequence = 0
    end = start + int(count * step) + 60_000
    for i in range(count):
        now = start + int(i * step)
        for at, record in workload.call(now, end):
            heapq.heappush(pending, (at, sequence, record))
            sequence += 1
        while pending and pending[0][0] <= now:
            yield heapq.heappop(pending)[2]
    while pending:
        yield heapq.heappop(pending)[2]


def with_offsets(records: list[LogRecord]) -> list[tuple[int, int, LogRecord]]:
    """(partition, offset, record): keyed by message id over ``PARTITIONS`` partitions."""
    offsets = [0] * PARTITIONS
    rows = []
    for record in records:
        partition = (
            int(hashlib.blake2b(record.message_id.encode(), digest_size=2).hexdigest(), 16)
            % PARTITIONS
        )
        rows.append((partition, offsets[partition], record))
        offsets[partition] += 1
    return rows


# ---- (1) ingest ----------------------------------------------------------------------------------


def ingest_rate(
    store: LogStore, records: int, batch: int, start: int, seed: int, warm_up: int = 0
) -> tuple[float, float]:
    """(log records/s, share of the writer thread's CPU in the wall time) of ``write()`` over
    about ``records`` records in batches of ``batch``, after ``warm_up`` records unmeasured
    (a long-running writer has the hot pages in its cache)."""
    total = records + warm_up
    rows = with_offsets(list(topic_order(Workload(seed), start, 2000, total // 3)))
    base = store.positions()  # a store that holds rows already: continue after its positions
    rows = [(p, o + base.get(p, 0), r) for p, o, r in rows]
    warm_up = min(warm_up, len(rows)) // batch * batch
    for i in range(0, warm_up, batch):
        store.write(rows[i : i + batch])
    measured = rows[warm_up:]
    entries = sum(len(r.entries) for _, _, r in measured)
    started, cpu = time.perf_counter(), time.thread_time()
    for i in range(0, len(measured), batch):
        store.write(measured[i : i + batch])
    elapsed = time.perf_counter() - started
    busy = (time.thread_time() - cpu) / elapsed
    rate = len(measured) / elapsed
    log(f"  {len(measured):,} records ({entries:,} entries) in {elapsed:.2f} s: {rate:,.0f}/s")
    return rate, busy


# ---- (2) the big store ---------------------------------------------------------------------------


def schema_key() -> str:
    """The tables' DDL, hashed: a cached store is rebuilt when they change (indexes are made to
    match ``INDEXES`` when it is opened)."""
    return hashlib.sha256("\n".join(TABLES).encode()).hexdigest()[:10]


def match_indexes(store: LogStore) -> None:
    """Make a cached store's indexes those of ``INDEXES``: drop the others and the changed ones,
    create the missing ones."""
    wanted = dict(INDEXES)
    for name, sql in store._db.query(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
    ):
        if name not in wanted or sql.split(" ON ", 1)[1] != wanted[name]:
            log(f"  dropping index {name} (not as in INDEXES)")
            store._db.run(f"DROP INDEX {name}")
    create_indexes(store)


def create_indexes(store: LogStore) -> None:
    for name, spec in INDEXES:
        began = time.monotonic()
        store._db.run(f"CREATE INDEX IF NOT EXISTS {name} ON {spec}")
        if time.monotonic() - began > 0.5:
            log(f"  index {name}: {time.monotonic() - began:.1f} s")


def build(store: LogStore, rows: int, end: int) -> dict[str, Any]:
    """Fill an empty store with about ``rows`` entries over the 7 days before ``end``, through
    the store's fold (all of a call's records at once: every journey is new), indexes dropped
    while the rows go in. Returns what the queries need: counts and sample message ids."""
    db = store._db
    for name, _spec in INDEXES:
        db.run(f"DROP INDEX IF EXISTS {name}")
    workload = Workload(seed=11)
    calls = int(rows / 6.2)  # entries per call, measured on the workload
    step = SPAN_MS / calls
    start = end - SPAN_MS
    event_names: dict[tuple[str, str, int], list[int]] = {}
    began = time.monotonic()
    entries = attempts = i = 0
    message_ids: list[str] = []
    next_report = 1_000_000
    while entries < rows:
        call_records = []
        for _ in range(2000):
            # the last 30 s of calls are still in flight
            call_records += [r for _t, r in workload.call(start + int(i * step), end - 30_000)]
            i += 1
            if i % 997 == 0:
                message_ids.append(call_records[-1].message_id)
        db.begin(write=True)
        batch = Batch(*store._writer._calls(_identities(call_records)))
        for record in call_records:
            batch.add(record)
        db.insert_many("entries", ENTRY_COLUMNS, batch.entries)
        journeys = [batch.journeys[k].params() for k in sorted(batch.touched)]
        db.insert_many("journeys", JOURNEY_COLUMNS, journeys)
        db.commit()
        for key, (counted, last) in batch.event_names.items():
            known = event_names.setdefault(key, [0, 0])
            known[0] += counted
            known[1] = max(known[1], last)
        entries += len(batch.entries)
        attempts += sum(1 for e in batch.entries if e[2] == "attempt")
        if entries >= next_report:
            next_report += 1_000_000
            rate = entries / (time.monotonic() - began)
            log(f"  {entries:,} of {rows:,} entries ({rate:,.0f}/s)")
    db.begin(write=True)
    db.insert_many(
        "event_names",
        ("source", "event", "hour", "calls", "last_seen"),
        [(*k, *v) for k, v in event_names.items()],
    )
    db.commit()
    log(f"  {entries:,} entries, {i:,} calls in {time.monotonic() - began:.0f} s; indexing")
    create_indexes(store)
    return {
        "entries": entries,
        "attempts": attempts,
        "calls": i,
        "end": end,
        "message_ids": message_ids,
    }


#: Bump when ``Workload`` changes: the cached stores were made by the old one.
WORKLOAD_VERSION = 2


def cached_path(rows: int) -> Path:
    name = f"log-store-{rows}-v{SCHEMA_VERSION}-{schema_key()}-w{WORKLOAD_VERSION}.sqlite3"
    return CACHE / name


def big_store(
    backend: str, url: str | None, rows: int, now: int
) -> tuple[LogStore, dict[str, Any]]:
    """The big store: for SQLite from the cache (built there if missing); for PostgreSQL at
    ``url``, built now."""
    if backend == "postgresql":
        assert url is not None
        store = open_store(url)
        meta = build(store, rows, now)
        store._db.run("ANALYZE")
        return store, meta
    CACHE.mkdir(exist_ok=True)
    path = cached_path(rows)
    info = path.with_suffix(".json")
    if path.exists() and info.exists():
        meta = json.loads(info.read_text())
        log(f"(2) cached store {path.name} ({path.stat().st_size / 1e9:.2f} GB)")
        store = open_store(str(path))
        match_indexes(store)
        return store, meta
    path.unlink(missing_ok=True)
    log(f"(2) building {path.name}")
    store = open_store(str(path))
    meta = build(store, rows, now)
    store._db.run("PRAGMA wal_checkpoint(TRUNCATE)")
    info.write_text(json.dumps(meta))
    return store, meta


def timed(function: Callable[[], Any], runs: int) -> tuple[float, float, Any]:
    """(median ms, slowest ms, last result) of ``runs`` calls."""
    times, result = [], None
    for _ in range(runs):
        started = time.perf_counter()
        result = function()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), max(times), result


def queries(
    store: LogStore, meta: dict[str, Any], runs: int
) -> list[tuple[str, float, float, int, float]]:
    """(what, median ms, max ms, rows, target ms) per query."""
    end = meta["end"]
    rng = random.Random(3)
    ids = rng.sample(meta["message_ids"], min(200, len(meta["message_ids"])))
    found = []
    trace_times = []
    for message_id in ids:
        started = time.perf_counter()
        trace = store.trace(message_id)
        trace_times.append((time.perf_counter() - started) * 1000)
        assert trace is not None and trace.entries, message_id
    found.append(
        (
            f"trace, {len(ids)} random calls (median, slowest)",
            statistics.median(trace_times),
            max(trace_times),
            1,
            50.0,
        )
    )
    some_user = next(
        (j.user_id for j in store.log(LogQuery(source=SOURCES[2], limit=50)) if j.user_id), "user-1"
    )
    some_anonymous = store.log(LogQuery(source=SOURCES[4], limit=1))[0].anonymous_id
    busiest = max(
        DESTINATIONS,
        key=lambda d: len(store.log(LogQuery(destination=d, since_ms=end - 60_000, limit=10_000))),
    )
    cases: list[tuple[str, LogQuery]] = [
        ("log, no filter", LogQuery()),
        (f"log --destination {busiest} (busiest)", LogQuery(destination=busiest)),
        ("log --destination dest-19 (rare)", LogQuery(destination="dest-19")),
        ("log --destination nowhere (no rows)", LogQuery(destination="nowhere")),
        (f"log --source {SOURCES[0]}", LogQuery(source=SOURCES[0])),
        (f"log --source {SOURCES[4]} (smallest)", LogQuery(source=SOURCES[4])),
        (f"log --user {some_user}", LogQuery(user=some_user)),
        (f"log --user {some_anonymous} (anonymous id)", LogQuery(user=some_anonymous)),
        ("log --user user-0 (1 % of all calls)", LogQuery(user="user-0")),
        ("log --type identify", LogQuery(call_type="identify")),
        ("log --type alias (1 %)", LogQuery(call_type="alias")),
        ("log --type delete (no rows)", LogQuery(call_type="delete")),
        *(
            (f"log --state {s}", LogQuery(state=s))
            for s in (
                "routed",
                "delivered",
                "waiting",
                "dead_lettered",
                "dropped",
                "suppressed",
                "failed",
            )
        ),
        ("log --since 1h", LogQuery(since_ms=end - HOUR_MS)),
        (
            "log --since 3d --until 2d",
            LogQuery(since_ms=end - 3 * DAY_MS, until_ms=end - 2 * DAY_MS),
        ),
        (
            "log --destination dest-19 --state failed",
            LogQuery(destination="dest-19", state="failed"),
        ),
        (
            "log --source source-4 --type page --since 1d",
            LogQuery(source="source-4", call_type="page", since_ms=end - DAY_MS),
        ),
        (
            "log --destination dest-05 --state dead_lettered --until 6d",
            LogQuery(destination="dest-05", state="dead_lettered", until_ms=end - 6 * DAY_MS),
        ),
    ]
    for what, query in cases:
        median, slowest, rows = timed(lambda q=query: store.log(q), runs)
        found.append((what, median, slowest, len(rows), 200.0))
    median, slowest, rows = timed(lambda: store.stats(end - HOUR_MS, end), runs)
    found.append(
        (
            f"stats, last hour ({sum(s.attempts for s in rows):,} attempts)",
            median,
            slowest,
            len(rows),
            500.0,
        )
    )
    median, slowest, rows = timed(lambda: store.stats(end - DAY_MS, end), max(1, runs // 2))
    found.append(
        (
            f"stats, last day ({sum(s.attempts for s in rows):,} attempts)",
            median,
            slowest,
            len(rows),
            0.0,
        )
    )
    median, slowest, rows = timed(lambda: store.event_names(SOURCES[0], end - DAY_MS), runs)
    found.append(("event_names, a source, last day", median, slowest, len(rows), 0.0))
    return found


def disk_bytes(store: LogStore) -> int:
    if store.backend == "sqlite":
        store._db.run("PRAGMA wal_checkpoint(TRUNCATE)")
        path = Path(store.url.removeprefix("sqlite:///"))
        return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
    return int(store._db.query("SELECT pg_database_size(current_database())")[0][0])


# ---- main ----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", type=int, help="entries in the big store (10,000,000; PostgreSQL 1,000,000)"
    )
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--batch", type=int, default=500, help="records per write()")
    parser.add_argument("--ingest-records", type=int, default=60_000, help="records a run")
    parser.add_argument("--runs", type=int, default=5, help="runs of each query")
    parser.add_argument("--ingest-only", action="store_true", help="(1) into an empty store only")
    args = parser.parse_args()
    rows = args.rows or (10_000_000 if args.backend == "sqlite" else 1_000_000)
    now = int(time.time() * 1000)
    server = None
    scratch = Path(tempfile.mkdtemp(prefix="bench-log-store-"))
    results: list[str] = []
    began = time.monotonic()
    try:
        if args.backend == "postgresql":
            from tests.pg_server import start_postgres

            server = start_postgres()
            log(f"PostgreSQL on port {server.port} ({server.bin_dir})")

        def url(name: str) -> str:
            if server is not None:
                return server.create_database(name)
            return str(scratch / f"{name}.sqlite3")

        log(f"(1) ingest into an empty {args.backend} store, batches of {args.batch}")
        rates = []
        for run in range(3):
            with open_store(url(f"empty{run}")) as empty:
                rate, busy = ingest_rate(empty, args.ingest_records, args.batch, now, seed=run)
                rates.append(rate)
        results.append(
            f"(1) write() into an empty store: {statistics.median(rates):,.0f} log records/s "
            f"(median of 3: {', '.join(f'{r:,.0f}' for r in rates)}; batches of {args.batch}; "
            f"writer thread {busy:.0%} busy)"
        )
        if args.ingest_only:
            return
        big, meta = big_store(args.backend, url("big") if server else None, rows, now)
        with big:
            size = disk_bytes(big)
            attempts = meta["attempts"]
            results.append(
                f"(3) disk: {size / 1e9:.2f} GB for {meta['entries']:,} entries "
                f"({attempts:,} attempts): {size / attempts:,.0f} bytes per attempt, "
                f"{size / attempts * 1e6 / 1e9:.2f} GB per million attempts"
            )
            # SQLite: as the store keeps itself (it never runs ANALYZE), then after an
            # operator's ANALYZE (its averages hide skew; the queries must not depend on them).
            # PostgreSQL: ANALYZEd, as autovacuum does.
            rounds = [("", False), (" [after ANALYZE]", True)] if server is None else [("", True)]
            for label, analyze in rounds:
                if server is None:
                    big._db.run("ANALYZE" if analyze else "DROP TABLE IF EXISTS sqlite_stat1")
                log(f"(2) queries at {meta['entries']:,} entries{label}, {args.runs} runs each")
                for what, median, slowest, count, target in queries(big, meta, args.runs):
                    verdict = "" if not target else "ok" if slowest < target else "OVER"
                    target_text = f"; target < {target:.0f} ms: {verdict}" if target else ""
                    results.append(
                        f"(2){label} {what}: {median:.1f} ms, slowest {slowest:.1f} ms, "
                        f"{count} rows{target_text}"
                    )
                    log(results[-1])
            if server is None:
                big._db.run("DROP TABLE IF EXISTS sqlite_stat1")  # the cache as the store keeps it
            if server is not None:  # PostgreSQL: into the big store itself
                log(f"(1) ingest into the {meta['entries']:,}-entry store")
                rate, busy = ingest_rate(
                    big, args.ingest_records, args.batch, now + 1000, seed=5, warm_up=20_000
                )
        if server is None:  # SQLite: into a copy, so that the cache stays as built
            copy = scratch / "full.sqlite3"
            shutil.copyfile(cached_path(rows), copy)
            log(f"(1) ingest into a copy of the {meta['entries']:,}-entry store")
            with open_store(str(copy)) as full:
                rate, busy = ingest_rate(
                    full, args.ingest_records, args.batch, now + 1000, seed=5, warm_up=20_000
                )
        results.append(
            f"(1) write() into the store of {meta['entries']:,} entries: {rate:,.0f} log "
            f"records/s after 20,000 to warm up (writer thread {busy:.0%} busy)"
        )
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
        print(
            f"\nbench.log_store: {args.backend}, {os.cpu_count()} CPUs, schema "
            f"v{SCHEMA_VERSION}, {time.monotonic() - began:.0f} s"
        )
        for line in results:
            print(line)


if __name__ == "__main__":
    main()
