"""The log store's behaviour, written once and run against each backend.

Not a test module: ``tests/unit/store/test_sqlite_store.py`` (a SQLite file) and
``tests/integration/test_log_store_db.py`` (a real PostgreSQL server) subclass ``LogStoreContract``
and give it a ``store_url`` fixture. Plus the helpers that build realistic log records: a routed
record is ``received`` + ``routed``, an attempt record is ``attempt`` + its conclusion.
"""

from __future__ import annotations

import re
import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from pipeline.core.log_entries import JourneyState, LogEntry, LogKind, LogRecord
from pipeline.store import LogQuery, LogStore, open_store
from pipeline.store import _writer as writer_module

#: 2026-11-18T12:00:00.000Z, on the hour (event names are counted per hour).
T0 = 1_795_003_200_000
S = 1000
MIN = 60 * S
HOUR = 60 * MIN

Identity = dict[str, Any]


def entry(kind: str, at: int, **fields: Any) -> LogEntry:
    return LogEntry(LogKind(kind), at, **fields)


def record(
    message_id: str,
    *entries: LogEntry,
    source: str = "web",
    call_type: str = "track",
    user: str | None = "u1",
    anonymous: str | None = None,
    event: str | None = "Order Completed",
) -> LogRecord:
    return LogRecord(
        message_id,
        source,
        call_type,
        user,
        anonymous,
        event if call_type == "track" else None,
        tuple(entries),
    )


def routed(message_id: str, destinations: tuple[str, ...], at: int, **identity: Any) -> LogRecord:
    """The router's record: received, then routed to ``destinations``."""
    return record(
        message_id,
        entry("received", at, size=321),
        entry("routed", at + 1, destinations=destinations),
        **identity,
    )


def attempt(
    message_id: str,
    destination: str,
    at: int,
    *,
    status: int | None = 200,
    error: str = "",
    duration: int = 10,
    number: int = 1,
    then: str = "delivered",
    tier: int = 0,
    reason: str = "",
    **identity: Any,
) -> LogRecord:
    """The delivery handler's record: one attempt and its conclusion (``then``: delivered,
    retry_scheduled, dead_lettered, or "" for none)."""
    entries = [
        entry(
            "attempt",
            at,
            destination=destination,
            url=f"https://{destination}.example/hook",
            status=status,
            error=error,
            duration_ms=duration,
            attempt=number,
            tier=-1 if number == 1 else tier - 1,
            response="" if error == "" else "upstream says no",
        )
    ]
    if then == "delivered":
        entries.append(entry("delivered", at + 1, destination=destination))
    elif then == "retry_scheduled":
        entries.append(
            entry(
                "retry_scheduled",
                at + 1,
                destination=destination,
                tier=tier,
                not_before=at + 10 * S,
            )
        )
    elif then == "dead_lettered":
        entries.append(entry("dead_lettered", at + 1, destination=destination, reason=reason))
    return record(message_id, *entries, **identity)


def failed(message_id: str, destination: str, at: int, **options: Any) -> LogRecord:
    """A failed attempt (503) that goes to retry tier 0."""
    options = {"status": 503, "error": "server_error", "then": "retry_scheduled", **options}
    return attempt(message_id, destination, at, **options)


class Feed:
    """Kafka offsets for records, per partition, as the consumer would see them."""

    def __init__(self) -> None:
        self.next: dict[int, int] = defaultdict(int)

    def __call__(self, *records: LogRecord, partition: int = 0) -> list[tuple[int, int, LogRecord]]:
        rows = []
        for r in records:
            rows.append((partition, self.next[partition], r))
            self.next[partition] += 1
        return rows


def keys(rows: list[Any]) -> set[tuple[str, str]]:
    return {(j.message_id, j.destination) for j in rows}


def snapshot(store: LogStore) -> list[Any]:
    """Everything the queries show, for comparing two stores or one store twice."""
    journeys = store.log(LogQuery(limit=10_000))
    traces = [store.trace(m) for m in sorted({j.message_id for j in journeys})]
    return [j.as_json() for j in journeys] + [t.as_json() for t in traces if t is not None]


# The dataset of the ``log`` filter tests: one call per row, each standing somewhere else.
#   m1 crm  web u1      track    delivered first time
#   m2 wh   app a2(anon) identify waiting after a 503
#   m3 crm  app u3      page     dead_lettered after a 400
#   m4 ads  web u4      track    delivered on the second attempt
#   m5 ""   web u5      alias    dropped as a whole
#   m6 crm  web u6+a6   screen   routed, in flight
#   m7 wh   web u7      group    suppressed
LOG_EXPECTED = {
    "destination": ({"destination": "crm"}, {"m1", "m3", "m6"}),
    "source": ({"source": "app"}, {"m2", "m3"}),
    "user id": ({"user": "u1"}, {"m1"}),
    "anonymous id": ({"user": "a2"}, {"m2"}),
    "either id": ({"user": "a6"}, {"m6"}),
    "call type": ({"call_type": "page"}, {"m3"}),
    "routed": ({"state": "routed"}, {"m6"}),
    "delivered": ({"state": "delivered"}, {"m1", "m4"}),
    "waiting": ({"state": "waiting"}, {"m2"}),
    "dead_lettered": ({"state": "dead_lettered"}, {"m3"}),
    "dropped": ({"state": "dropped"}, {"m5"}),
    "suppressed": ({"state": "suppressed"}, {"m7"}),
    "failed": ({"state": "failed"}, {"m2", "m3", "m4"}),
    "since": ({"since_ms": T0 + 30 * S}, {"m4", "m5", "m6", "m7"}),
    "until": ({"until_ms": T0 + 30 * S}, {"m1", "m2", "m3"}),
    "since and until": ({"since_ms": T0 + 10 * S, "until_ms": T0 + 30 * S}, {"m2", "m3"}),
    "destination and state": ({"destination": "crm", "state": "dead_lettered"}, {"m3"}),
}


class LogStoreContract:
    """Subclasses provide ``store_url``: a URL of an empty store."""

    @pytest.fixture
    def store_url(self) -> str:
        raise NotImplementedError

    @pytest.fixture
    def store(self, store_url: str) -> Iterator[LogStore]:
        opened = open_store(store_url)
        yield opened
        opened.close()

    @pytest.fixture
    def feed(self) -> Feed:
        return Feed()

    def test_two_writers_share_the_store_each_on_its_partitions(self, store_url: str):
        """Two stores on one URL (two log-store processes), each writing its own partition from
        its own thread."""
        stores = [open_store(store_url), open_store(store_url)]
        errors: list[BaseException] = []

        def write(partition: int) -> None:
            feed = Feed()
            try:
                for i in range(50):
                    message = f"p{partition}-{i}"
                    rows = feed(
                        routed(message, ("crm", "wh"), T0 + i),
                        attempt(message, "crm", T0 + i + 1),
                        partition=partition,
                    )
                    stores[partition].write(rows)
            except BaseException as exc:  # noqa: BLE001  (reported below)
                errors.append(exc)

        threads = [threading.Thread(target=write, args=(p,)) for p in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        try:
            assert errors == []
            assert stores[0].positions() == {0: 100, 1: 100}
            assert len(stores[1].log(LogQuery(state="delivered", limit=1000))) == 100
            assert len(stores[1].log(LogQuery(state="routed", limit=1000))) == 100
        finally:
            for opened in stores:
                opened.close()

    @pytest.fixture
    def log_dataset(self, store: LogStore, feed: Feed) -> LogStore:
        t = T0
        store.write(
            feed(
                routed("m1", ("crm",), t),
                attempt("m1", "crm", t + S),
                routed(
                    "m2",
                    ("wh",),
                    t + 10 * S,
                    source="app",
                    call_type="identify",
                    user=None,
                    anonymous="a2",
                ),
                failed(
                    "m2",
                    "wh",
                    t + 11 * S,
                    source="app",
                    call_type="identify",
                    user=None,
                    anonymous="a2",
                ),
                routed("m3", ("crm",), t + 20 * S, source="app", call_type="page", user="u3"),
                attempt(
                    "m3",
                    "crm",
                    t + 21 * S,
                    status=400,
                    error="client_error",
                    then="dead_lettered",
                    reason="client_error",
                    source="app",
                    call_type="page",
                    user="u3",
                ),
                routed("m4", ("ads",), t + 30 * S, user="u4"),
                failed("m4", "ads", t + 31 * S, user="u4"),
                attempt("m4", "ads", t + 41 * S, number=2, tier=1, user="u4"),
                record(
                    "m5",
                    entry("received", t + 40 * S),
                    entry("dropped", t + 40 * S + 1, reason="no_destination"),
                    call_type="alias",
                    user="u5",
                ),
                routed("m6", ("crm",), t + 50 * S, call_type="screen", user="u6", anonymous="a6"),
                routed("m7", ("wh",), t + 60 * S, call_type="group", user="u7"),
                record(
                    "m7",
                    entry("suppressed", t + 61 * S, destination="wh"),
                    call_type="group",
                    user="u7",
                ),
            )
        )
        return store

    # ---- the store itself ----------------------------------------------------------------------

    def test_a_new_store_has_an_id_that_it_keeps(self, store: LogStore, store_url: str):
        assert re.fullmatch(r"[0-9a-f]{32}", store.store_id)
        assert store.positions() == {}
        again = open_store(store_url)  # the schema exists: opening again changes nothing
        try:
            assert again.store_id == store.store_id
        finally:
            again.close()

    def test_reset_empties_the_store_and_makes_a_new_id(self, store: LogStore, feed: Feed):
        store.write(feed(routed("m1", ("crm",), T0), attempt("m1", "crm", T0 + S)))
        before = store.store_id
        store.reset()
        assert store.store_id != before
        assert store.positions() == {}
        assert store.trace("m1") is None
        assert store.log(LogQuery()) == []
        assert store.stats(0) == []
        assert store.event_names("web", 0) == []
        # and it takes writes again from offset 0 (the consumer reads the topic again)
        assert store.write(Feed()(routed("m1", ("crm",), T0))) == 2
        assert store.positions() == {0: 1}

    # ---- trace ---------------------------------------------------------------------------------

    def test_trace_shows_identity_entries_and_each_destination(self, store: LogStore, feed: Feed):
        store.write(
            feed(
                routed("m1", ("crm", "wh"), T0, user="u1", anonymous="a1"),
                failed("m1", "crm", T0 + S, duration=0),
                attempt("m1", "wh", T0 + S + 500, duration=42),
            )
        )
        trace = store.trace("m1")
        assert trace is not None
        assert (trace.source, trace.call_type, trace.user_id, trace.anonymous_id, trace.event) == (
            "web",
            "track",
            "u1",
            "a1",
            "Order Completed",
        )
        assert [e.kind.value for e in trace.entries] == [
            "received",
            "routed",
            "attempt",
            "retry_scheduled",
            "attempt",
            "delivered",
        ]
        failed_attempt = trace.entries[2]
        assert failed_attempt == entry(
            "attempt",
            T0 + S,
            destination="crm",
            url="https://crm.example/hook",
            status=503,
            error="server_error",
            duration_ms=0,
            attempt=1,
            response="upstream says no",
        )
        assert trace.entries[1].destinations == ("crm", "wh")
        assert trace.entries[0].size == 321
        crm, wh = trace.destinations
        assert (crm.destination, crm.state, crm.tier, crm.not_before) == (
            "crm",
            JourneyState.WAITING,
            0,
            T0 + S + 10 * S,
        )
        assert (crm.attempts, crm.failed_attempts, crm.last_status, crm.last_error) == (
            1,
            1,
            503,
            "server_error",
        )
        assert (wh.state, wh.attempts, wh.failed_attempts, wh.last_status, wh.last_error) == (
            JourneyState.DELIVERED,
            1,
            0,
            200,
            None,
        )
        assert (crm.first_seen, crm.last_updated) == (T0, T0 + S + 1)
        as_json = trace.as_json()
        assert as_json["entries"][0] == {
            "kind": "received",
            "at": "2026-11-18T12:00:00.000Z",
            "size": 321,
        }
        assert as_json["entries"][2]["duration_ms"] == 0  # set, though 0
        assert as_json["destinations"][0]["not_before"] == "2026-11-18T12:00:11.000Z"
        assert as_json["purged_at"] is None
        assert store.trace("never-seen") is None

    def test_trace_of_every_state(self, store: LogStore, feed: Feed):
        t = T0
        store.write(
            feed(
                routed("routed", ("crm",), t),
                routed("delivered", ("crm",), t),
                attempt("delivered", "crm", t + S),
                routed("waiting", ("crm",), t),
                failed("waiting", "crm", t + S, tier=2),
                routed("dead", ("crm",), t),
                attempt(
                    "dead",
                    "crm",
                    t + S,
                    status=None,
                    error="tls_error",
                    then="dead_lettered",
                    reason="tls_error",
                ),
                record("dropped", entry("received", t), entry("dropped", t + 1, reason="no_route")),
                routed("partly", ("crm",), t),
                record("partly", entry("dropped", t + 2, destination="wh", reason="filtered")),
                routed("suppressed", ("crm",), t),
                record("suppressed", entry("suppressed", t + S, destination="crm")),
                routed("replayed", ("crm",), t),
                attempt(
                    "replayed",
                    "crm",
                    t + S,
                    status=400,
                    error="client_error",
                    then="dead_lettered",
                    reason="client_error",
                ),
                record(
                    "replayed", entry("replayed", t + 5 * S, destination="crm", replay_id="r-1")
                ),
            )
        )

        def states(message_id: str) -> dict[str, tuple[Any, ...]]:
            trace = store.trace(message_id)
            assert trace is not None
            return {j.destination: (j.state.value, j.reason, j.tier) for j in trace.destinations}

        assert states("routed") == {"crm": ("routed", None, None)}
        assert states("delivered") == {"crm": ("delivered", None, None)}
        assert states("waiting") == {"crm": ("waiting", None, 2)}
        assert states("dead") == {"crm": ("dead_lettered", "tls_error", None)}
        assert states("dropped") == {"": ("dropped", "no_route", None)}
        assert states("partly") == {
            "crm": ("routed", None, None),
            "wh": ("dropped", "filtered", None),
        }
        assert states("suppressed") == {"crm": ("suppressed", None, None)}
        replayed = store.trace("replayed")
        assert replayed is not None
        (journey,) = replayed.destinations
        assert (journey.state, journey.reason, journey.replay_id) == (
            JourneyState.ROUTED,
            None,
            "r-1",
        )
        assert replayed.entries[-1].replay_id == "r-1"
        dead = store.trace("dead")
        assert dead is not None and dead.destinations[0].last_status is None

    def test_a_resend_dropped_as_a_duplicate_leaves_the_call_where_it_was(
        self, store: LogStore, feed: Feed
    ):
        """The router drops a resend (``reason`` ``duplicate``): the trace shows it, after the
        first copy's journey, and the call's state stays what its first copy made it."""
        t = T0
        first = "a resend of the call first received at 2027-01-15T08:00:00.000Z"
        store.write(
            feed(
                routed("m1", ("crm",), t),
                attempt("m1", "crm", t + S, status=200, then="delivered"),
                record(
                    "m1",
                    entry("received", t + 5 * S),
                    entry("dropped", t + 5 * S + 1, reason="duplicate", error=first),
                ),
            )
        )
        trace = store.trace("m1")
        assert trace is not None
        assert [(e.kind.value, e.reason, e.error) for e in trace.entries][-2:] == [
            ("received", "", ""),
            ("dropped", "duplicate", first),
        ]
        states = {j.destination: j.state for j in trace.destinations}
        assert states == {"": JourneyState.ROUTED, "crm": JourneyState.DELIVERED}

    def test_a_received_body_is_kept_when_the_pipeline_logs_it(self, store: LogStore, feed: Feed):
        body = '{"type":"track","event":"Order Completed"}'
        store.write(feed(record("m1", entry("received", T0, size=44, body=body))))
        trace = store.trace("m1")
        assert trace is not None and trace.entries[0].body == body
        assert trace.as_json()["entries"][0]["body"] == body

    # ---- log -----------------------------------------------------------------------------------

    @pytest.mark.parametrize("case", sorted(LOG_EXPECTED))
    def test_log_filters(self, log_dataset: LogStore, case: str):
        options, expected = LOG_EXPECTED[case]
        everything = {j.message_id for j in log_dataset.log(LogQuery(limit=100))}
        assert everything == {f"m{i}" for i in range(1, 8)}
        assert expected != everything  # so that ignoring the filter fails
        found = log_dataset.log(LogQuery(limit=100, **options))
        assert {j.message_id for j in found} == expected

    def test_log_is_newest_first_and_limited(self, log_dataset: LogStore):
        rows = log_dataset.log(LogQuery(limit=3))
        assert [j.message_id for j in rows] == ["m7", "m6", "m4"]
        updated = [j.last_updated for j in log_dataset.log(LogQuery())]
        assert updated == sorted(updated, reverse=True)

    def test_log_rows_carry_the_journey(self, log_dataset: LogStore):
        (m2,) = log_dataset.log(LogQuery(user="a2"))
        assert m2.as_json() == {
            "message_id": "m2",
            "destination": "wh",
            "state": "waiting",
            "source": "app",
            "call_type": "identify",
            "user_id": None,
            "anonymous_id": "a2",
            "event": None,
            "first_seen": "2026-11-18T12:00:10.000Z",
            "last_updated": "2026-11-18T12:00:11.001Z",
            "attempts": 1,
            "failed_attempts": 1,
            "last_status": 503,
            "last_error": "server_error",
            "reason": None,
            "tier": 0,
            "not_before": "2026-11-18T12:00:21.000Z",
            "replay_id": None,
        }

    # ---- stats ---------------------------------------------------------------------------------

    def test_stats_per_destination(self, store: LogStore, feed: Feed):
        t = T0
        rows = []
        for i in range(1, 21):  # good: 20 attempts of 1..20 ms, all delivered
            rows += [routed(f"g{i}", ("good",), t), attempt(f"g{i}", "good", t + i * S, duration=i)]
        rows += [routed("old", ("good",), t - 2 * HOUR), failed("old", "good", t - 2 * HOUR + S)]
        # bad: 3 failures of 100, 200, 300 ms, then one success of 400 ms; one dead letter
        rows += [
            routed("b1", ("bad",), t),
            failed("b1", "bad", t + S, duration=300),
            attempt("b1", "bad", t + 11 * S, duration=400, number=2, tier=1),
            routed("b2", ("bad",), t),
            attempt(
                "b2",
                "bad",
                t + 2 * S,
                status=404,
                error="client_error",
                duration=100,
                then="dead_lettered",
                reason="client_error",
            ),
            routed("b3", ("bad",), t),
            failed("b3", "bad", t + 50 * S, status=502, duration=200),
            routed("i1", ("idle",), t - 3 * HOUR),
            failed("i1", "idle", t - 3 * HOUR + S),
        ]
        store.write(feed(*rows))
        stats = store.stats(t, t + HOUR)
        # problems first: the lowest success ratio; then dead letters, waiting calls, the name
        assert [s.destination for s in stats] == ["bad", "good", "idle"]
        bad, good, idle = stats
        assert (good.attempts, good.delivered, good.failed, good.success_ratio) == (20, 20, 0, 1.0)
        assert (good.p50_ms, good.p95_ms) == (10, 19)  # nearest rank
        assert (good.last_error, good.last_error_at, good.dead_lettered) == (None, None, 0)
        assert good.waiting == 1  # "old" still waits, whatever the window
        assert (bad.attempts, bad.delivered, bad.failed, bad.success_ratio) == (4, 1, 3, 0.25)
        assert (bad.p50_ms, bad.p95_ms) == (200, 400)
        assert (bad.last_error, bad.last_error_status, bad.last_error_at) == (
            "server_error",
            502,
            t + 50 * S,
        )
        assert (bad.waiting, bad.dead_lettered) == (1, 1)
        assert (idle.attempts, idle.success_ratio, idle.p50_ms, idle.waiting) == (0, None, None, 1)
        assert bad.as_json()["last_error_at"] == "2026-11-18T12:00:50.000Z"
        assert bad.as_json()["success_ratio"] == 0.25
        # an earlier window sees the earlier failures only (and what waits now)
        early = {s.destination: s for s in store.stats(t - 4 * HOUR, t)}
        assert (early["good"].attempts, early["good"].failed, early["good"].last_error_status) == (
            1,
            1,
            503,
        )
        assert (early["idle"].attempts, early["idle"].failed) == (1, 1)
        assert (early["bad"].attempts, early["bad"].waiting) == (0, 1)
        assert {s.destination for s in store.stats(t)} == {"good", "bad", "idle"}

    # ---- idempotence and order -----------------------------------------------------------------

    def test_a_batch_written_twice_is_applied_once(self, store: LogStore, feed: Feed):
        batch = feed(
            routed("m1", ("crm", "wh"), T0),
            failed("m1", "crm", T0 + S),
            attempt("m1", "wh", T0 + S),
            routed("m2", ("crm",), T0, call_type="identify"),
        )
        assert store.write(batch) == 8
        once = snapshot(store)
        assert store.write(batch) == 0
        assert snapshot(store) == once
        assert store.positions() == {0: 4}

    def test_the_records_of_one_kafka_record_are_applied_together_and_once(self, store: LogStore):
        # A LogBatch: three log records at offset 4 of partition 0, then one at offset 5.
        batch = [
            (0, 4, routed("m1", ("crm",), T0)),
            (0, 4, routed("m2", ("crm",), T0)),
            (0, 4, attempt("m1", "crm", T0 + S)),
            (0, 5, routed("m3", ("crm",), T0)),
        ]
        assert store.write(batch) == 8
        assert store.positions() == {0: 6}
        once = snapshot(store)
        assert store.write(batch[:3]) == 0
        assert store.write(batch + batch[:3]) == 0
        assert snapshot(store) == once
        fresh = [(0, 6, routed("m4", ("crm",), T0)), (0, 6, routed("m5", ("crm",), T0))]
        assert store.write(fresh + batch) == 4  # the new Kafka record's two; the old one again: not
        assert store.positions() == {0: 7}

    def test_an_overlapping_batch_applies_only_what_is_new(self, store: LogStore, feed: Feed):
        rows = feed(*(routed(f"m{i}", ("crm",), T0 + i) for i in range(8)))
        other = feed(routed("p1", ("crm",), T0), partition=1)
        assert store.write(rows[:5] + other) == 12
        again = rows[2:] + rows[6:] + other  # 5, 6, 7 are new; 6 and 7 twice: once
        assert store.write(again) == 6
        assert store.positions() == {0: 8, 1: 1}
        assert len(store.log(LogQuery(limit=100))) == 9
        for i in range(8):
            trace = store.trace(f"m{i}")
            assert trace is not None and len(trace.entries) == 2

    def test_large_writes_store_every_row_and_update_every_journey(
        self, store: LogStore, feed: Feed
    ):
        # Counts that are not multiples of the backends' rows per statement: every row of the
        # bulk inserts and of the bulk journey updates lands, each on its own row.
        count = 601
        routed_rows = feed(*(routed(f"m{i}", ("crm", "wh"), T0 + i) for i in range(count)))
        assert store.write(routed_rows) == 2 * count
        attempts = [attempt(f"m{i}", "crm", T0 + HOUR + i) for i in range(count)]
        attempts += [failed(f"m{i}", "wh", T0 + HOUR + i) for i in range(0, count, 3)]
        assert store.write(feed(*attempts)) == 2 * len(attempts)
        journeys = {(j.message_id, j.destination): j for j in store.log(LogQuery(limit=10_000))}
        assert len(journeys) == 2 * count
        for i in range(count):
            crm, wh = journeys[(f"m{i}", "crm")], journeys[(f"m{i}", "wh")]
            assert crm.state == JourneyState.DELIVERED and crm.last_updated == T0 + HOUR + i + 1
            assert crm.attempts == 1 and crm.first_seen == T0 + i and crm.user_id == "u1"
            if i % 3 == 0:
                assert wh.state == JourneyState.WAITING and wh.failed_attempts == 1
                assert wh.last_status == 503 and wh.not_before == T0 + HOUR + i + 10 * S
            else:
                assert wh.state == JourneyState.ROUTED and wh.attempts == 0
        trace = store.trace(f"m{count - 2}")  # not retried (600 is)
        assert trace is not None and [e.kind for e in trace.entries] == [
            LogKind.RECEIVED,
            LogKind.ROUTED,
            LogKind.ATTEMPT,
            LogKind.DELIVERED,
        ]

    def test_empty_writes_and_records_without_entries(self, store: LogStore, feed: Feed):
        assert store.write([]) == 0
        assert store.write(feed(record("m1"))) == 0
        assert store.positions() == {0: 1}
        assert store.trace("m1") is None

    def test_state_follows_the_latest_entry_whatever_the_order(self, store_url: str, feed: Feed):
        records = [
            routed("m1", ("crm", "wh"), T0, user=None, anonymous="a1"),
            failed("m1", "crm", T0 + S, user="u1"),
            attempt("m1", "crm", T0 + 11 * S, number=2, tier=1, user=None),
            attempt(
                "m1",
                "wh",
                T0 + 2 * S,
                status=500,
                error="server_error",
                then="dead_lettered",
                reason="deadline_exceeded",
                user=None,
            ),
        ]
        results = []
        for order in (records, records[::-1], [records[2], records[0], records[3], records[1]]):
            with open_store(store_url) as store:
                store.reset()
                for partition, r in enumerate(order):  # out of order only across partitions
                    store.write(Feed()(r, partition=partition))
                results.append(snapshot(store))
                assert (
                    len(store.log(LogQuery(user="u1"))) == len(store.log(LogQuery(user="a1"))) == 2
                )
        assert results[0] == results[1] == results[2]
        journeys = {j["destination"]: j for j in results[0] if "destination" in j and "state" in j}
        crm, wh = journeys["crm"], journeys["wh"]
        assert (crm["state"], crm["attempts"], crm["failed_attempts"], crm["last_status"]) == (
            "delivered",
            2,
            1,
            200,
        )
        assert (crm["tier"], crm["not_before"], crm["last_error"]) == (None, None, None)
        assert (crm["user_id"], crm["anonymous_id"], crm["first_seen"]) == (
            "u1",  # filled in by the one record that had it, never blanked
            "a1",
            "2026-11-18T12:00:00.000Z",
        )
        assert (wh["state"], wh["reason"]) == ("dead_lettered", "deadline_exceeded")

    def test_on_a_tie_the_later_entry_wins(self, store: LogStore, feed: Feed):
        store.write(
            feed(
                routed("m1", ("crm",), T0),
                record(
                    "m1",
                    entry(
                        "retry_scheduled", T0 + S, destination="crm", tier=0, not_before=T0 + 9 * S
                    ),
                    entry("dead_lettered", T0 + S, destination="crm", reason="deadline_exceeded"),
                ),
            )
        )
        trace = store.trace("m1")
        assert trace is not None and trace.destinations[0].state is JourneyState.DEAD_LETTERED

    # ---- deletion requests ---------------------------------------------------------------------

    def _purge_rows(self, feed: Feed) -> dict[str, list[tuple[int, int, LogRecord]]]:
        """The user ux's calls around a deletion request for ux at T0 + 10 s (partition 1)."""
        return {
            "old": feed(
                routed("old", ("crm",), T0, user="ux"), failed("old", "crm", T0 + S, user="ux")
            ),
            "other": feed(routed("other", ("crm",), T0, user="uy")),
            "delete": feed(
                routed("del", ("crm",), T0 + 10 * S, call_type="delete", user="ux"), partition=1
            ),
            "retry": feed(attempt("old", "crm", T0 + 20 * S, number=2, tier=1, user="ux")),
            "new": feed(routed("new", ("crm",), T0 + 30 * S, user="ux")),
        }

    def _assert_purged(self, store: LogStore) -> None:
        trace = store.trace("old")
        assert trace is not None
        assert trace.purged_at == T0 + 10 * S
        assert (trace.entries, trace.destinations, trace.user_id, trace.source) == (
            (),
            (),
            None,
            None,
        )
        assert trace.as_json()["purged_at"] == "2026-11-18T12:00:10.000Z"
        assert {j.message_id for j in store.log(LogQuery(user="ux"))} == {"del", "new"}
        assert {j.message_id for j in store.log(LogQuery(limit=100))} == {"del", "new", "other"}
        kept = store.trace("new")
        assert kept is not None and len(kept.entries) == 2 and kept.purged_at is None

    def test_a_deletion_request_purges_the_users_earlier_calls(self, store: LogStore, feed: Feed):
        rows = self._purge_rows(feed)
        store.write(rows["old"] + rows["other"])
        store.write(rows["delete"])
        store.write(rows["retry"])  # (a) a later entry of a purged call is not stored
        store.write(rows["new"])  # a call sent after the request is kept
        self._assert_purged(store)

    def test_a_purge_in_the_same_batch(self, store: LogStore, feed: Feed):
        rows = self._purge_rows(feed)
        store.write(rows["old"] + rows["other"] + rows["delete"] + rows["retry"] + rows["new"])
        self._assert_purged(store)

    def test_a_purge_holds_when_the_topic_is_read_again(self, store: LogStore, feed: Feed):
        rows = self._purge_rows(feed)
        store.write(rows["old"] + rows["other"] + rows["delete"] + rows["retry"] + rows["new"])
        store.reset()
        # (b) read again, partition 1 first: the request comes before the older calls
        store.write(rows["delete"])
        store.write(rows["old"] + rows["other"])
        store.write(rows["retry"] + rows["new"])
        self._assert_purged(store)

    def test_a_purge_takes_what_came_before_the_calls_received(self, store: LogStore, feed: Feed):
        # The delivery handler's record (no user id) reaches the store before the router's,
        # which names the user: their Kafka records are on different partitions.
        store.write(feed(attempt("early", "crm", T0 + S)))
        store.write(feed(routed("del", ("crm",), T0 + 10 * S, call_type="delete", user="ux")))
        store.write(feed(routed("early", ("crm",), T0, user="ux"), partition=1))
        trace = store.trace("early")
        assert trace is not None and trace.purged_at == T0 + 10 * S
        assert (trace.entries, trace.destinations) == ((), ())
        assert {j.message_id for j in store.log(LogQuery(limit=100))} == {"del"}

    def test_the_same_user_purged_twice(self, store: LogStore, feed: Feed):
        rows = self._purge_rows(feed)
        store.write(rows["old"] + rows["other"] + rows["delete"] + rows["new"])
        store.write(feed(routed("del2", ("crm",), T0 + 40 * S, call_type="delete", user="ux")))
        assert {j.message_id for j in store.log(LogQuery(user="ux"))} == {"del2"}
        new = store.trace("new")
        assert new is not None and new.purged_at == T0 + 40 * S
        old = store.trace("old")
        assert old is not None and old.purged_at == T0 + 10 * S

    # ---- retention -----------------------------------------------------------------------------

    def test_expire_deletes_what_is_older(self, store: LogStore, feed: Feed):
        rows = self._purge_rows(feed)
        store.write(rows["old"] + rows["other"] + rows["delete"])
        store.write(
            feed(routed("late", ("crm",), T0 + 2 * HOUR), attempt("late", "crm", T0 + 2 * HOUR + S))
        )
        assert store.expire(T0 + HOUR) == 4  # other: 2 entries, del: 2 (old's went with the purge)
        assert store.trace("other") is None
        assert store.trace("old") is None  # the purge itself is older than the retention
        late = store.trace("late")
        assert late is not None and len(late.entries) == 4
        assert {j.message_id for j in store.log(LogQuery())} == {"late"}
        assert [s.destination for s in store.stats(0)] == ["crm"]
        assert [e.name for e in store.event_names("web", 0)] == ["Order Completed"]
        assert store.event_names("web", 0)[0].calls == 1
        assert store.expire(T0 + HOUR) == 0

    def test_expire_in_chunks(self, store: LogStore, feed: Feed, monkeypatch: pytest.MonkeyPatch):
        monkeypatch.setattr(writer_module, "EXPIRE_CHUNK", 3)
        # 8 calls of 2 entries each; four share one millisecond (ties at a chunk's cut)
        times = [T0, T0, T0, T0, T0 + 5, T0 + 6, T0 + 7, T0 + HOUR]
        store.write(feed(*(routed(f"m{i}", ("crm",), at) for i, at in enumerate(times))))
        assert store.expire(T0 + MIN) == 14
        assert {j.message_id for j in store.log(LogQuery())} == {"m7"}
        assert store.expire(T0 + MIN) == 0

    def test_hourly_figures_per_destination(self, store: LogStore, feed: Feed):
        rows = [
            routed("a", ("crm",), T0),
            attempt("a", "crm", T0 + S),  # hour 0: delivered
            routed("b", ("crm",), T0 + HOUR + S),
            failed("b", "crm", T0 + HOUR + 2 * S),  # hour 1: one failed attempt, ...
            attempt(
                "b",
                "crm",
                T0 + HOUR + 3 * S,
                status=404,
                error="client_error",
                then="dead_lettered",
                reason="client_error",
            ),  # ... then a failed one that dead-letters
            routed("c", ("ads",), T0 - HOUR),
            attempt("c", "ads", T0 - HOUR + S),  # before the window
        ]
        store.write(feed(*rows))
        hourly = store.hourly(T0, T0 + 2 * HOUR)
        assert hourly == {"crm": [(T0, 1, 0, 0), (T0 + HOUR, 0, 2, 1)]}
        assert store.hourly(T0 - HOUR, T0)["ads"] == [(T0 - HOUR, 1, 0, 0)]
        assert store.hourly(T0 + 2 * HOUR) == {}

    # ---- event names ---------------------------------------------------------------------------

    def test_event_names_of_a_source(self, store: LogStore, feed: Feed):
        rows = [routed(f"a{i}", ("crm",), T0 + i * S, event="Signed Up") for i in range(3)]
        rows += [routed("b", ("crm",), T0 + 5 * MIN, event="Order Completed")]
        rows += [routed("old", ("crm",), T0 - 2 * HOUR, event="Old Event")]
        rows += [routed("c", ("crm",), T0, source="app", event="Other Source")]
        rows += [routed("d", ("crm",), T0, call_type="identify")]  # not a track call
        store.write(feed(*rows))
        names = store.event_names("web", T0)
        assert names == [("Signed Up", 3, T0 + 2 * S), ("Order Completed", 1, T0 + 5 * MIN)]
        assert names[0].as_json() == {
            "name": "Signed Up",
            "calls": 3,
            "last_seen": "2026-11-18T12:00:02.000Z",
        }
        assert {n.name for n in store.event_names("web", T0 - 3 * HOUR)} == {
            "Signed Up",
            "Order Completed",
            "Old Event",
        }
        assert store.event_names("nobody", 0) == []

    # ---- text from outside ---------------------------------------------------------------------

    def test_hostile_strings_are_stored_and_found(self, store: LogStore, feed: Feed):
        nasty = "u\x00\x1b[31m\u202e\ud800💥'; DROP TABLE journeys; --"
        store.write(
            feed(
                routed(
                    nasty, ("d\x00",), T0, user=nasty, anonymous=nasty, event=nasty, source=nasty
                ),
                failed(nasty, "d\x00", T0 + S, user=nasty, error=nasty, source=nasty),
            )
        )
        trace = store.trace(nasty)  # found by the same text
        assert trace is not None and len(trace.entries) == 4
        assert trace.user_id == trace.event == "u\ufffd\x1b[31m\u202e?💥'; DROP TABLE journeys; --"
        assert trace.destinations[0].destination == "d\ufffd"
        assert {j.message_id for j in store.log(LogQuery(user=nasty))} == {trace.message_id}
        assert len(store.log(LogQuery(destination="d\x00", source=nasty))) == 1
        assert [n.name for n in store.event_names(nasty, 0)] == [trace.event]
        assert store.stats(0)[0].last_error == trace.event
