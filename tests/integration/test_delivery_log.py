"""The delivery log end to end: calls through a real worker (router, deliver, retry, log-store),
real receivers, the store on a real file, and the ``trace``/``log``/``stats`` commands reading it.

Every state a trace reports (delivered, waiting, dead_lettered, dropped per call and per
destination), every filter of ``log``, ``stats``, the deletion purge, and the log-store's own
faults: killed and restarted, rebuilt, and its store down while calls are delivered.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.settings import Settings
from pipeline.kafka.clients import topics_for
from pipeline.store import LogQuery, open_store
from tests.support import (
    InProcessWorker,
    Receiver,
    Stderr,
    apply,
    run_cli,
    send_calls,
    simple_config,
    started,
    topic_ends,
    wait_for,
    wait_or_tell,
)

WORKER_ROLES = ("router", "deliver", "retry", "log-store")


@pytest.fixture
def logged(settings: Settings, tmp_path: Path) -> Settings:
    """The test's settings with the delivery log on and its store in the test's directory."""
    return settings.replace(log=True, log_store_url=f"sqlite:///{tmp_path / 'log.sqlite3'}")


def cli_json(settings: Settings, *args: str) -> list[dict[str, Any]]:
    result = run_cli(settings, *args, "--json")
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


class Store:
    """The test's store, read through the Python API the commands use."""

    def __init__(self, settings: Settings) -> None:
        self.url = settings.log_store_url

    def trace(self, message_id: str) -> Any:
        store = open_store(self.url)
        try:
            return store.trace(message_id)
        finally:
            store.close()

    def states(self, message_id: str) -> dict[str, str]:
        trace = self.trace(message_id)
        return {} if trace is None else {j.destination: j.state.value for j in trace.destinations}

    def log(self, **filters: Any) -> list[Any]:
        store = open_store(self.url)
        try:
            return store.log(LogQuery(**filters))
        finally:
            store.close()


def two_sources(ok: Receiver, bad: Receiver, failing: Receiver) -> dict[str, Any]:
    """Source ``a`` → ``ok`` (200), ``bad`` (404), ``off`` (disabled); source ``b`` →
    ``slow`` (500: retried). ``a`` blocks the track event ``Debug Event``."""

    def dest(ident: str, source: str, url: str, enabled: bool = True) -> dict[str, Any]:
        return {
            "id": ident,
            "name": ident.title(),
            "enabled": enabled,
            "sources": [source],
            "webhooks": [{"url": url}],
        }

    return {
        "sources": [
            {"id": "a", "write_keys": ["wk-a"], "blocked_events": ["Debug Event"]},
            {"id": "b", "write_keys": ["wk-b"]},
        ],
        "destinations": [
            dest("ok", "a", ok.url),
            dest("bad", "a", bad.url),
            dest("off", "a", ok.url, enabled=False),
            dest("slow", "b", failing.url),
        ],
    }


@pytest.fixture
def journeys(
    logged: Settings, receiver_factory: Callable[..., Receiver]
) -> Iterator[tuple[Settings, Store]]:
    """The four calls of ``two_sources`` sent through a worker, each in its final or waiting
    state in the store; the worker keeps running during the test."""
    ok, bad, failing = receiver_factory(200), receiver_factory(404), receiver_factory(500)
    settings = logged.replace(retry_delays=(30.0,), retry_deadline=120.0)
    apply(settings, two_sources(ok, bad, failing))
    worker = InProcessWorker(settings, WORKER_ROLES)
    try:
        send_calls(
            settings,
            [
                {"type": "track", "event": "Order", "userId": "u1", "messageId": "m-order"},
                {"type": "track", "event": "Debug Event", "userId": "u1", "messageId": "m-debug"},
                {
                    "type": "identify",
                    "userId": "u2",
                    "messageId": "m-none",
                    "integrations": {"All": False},
                },
            ],
            "wk-a",
        )
        send_calls(
            settings, [{"type": "page", "anonymousId": "anon-3", "messageId": "m-page"}], "wk-b"
        )
        store = Store(settings)
        expected = {
            "m-order": {"ok": "delivered", "bad": "dead_lettered", "off": "dropped"},
            "m-debug": {"": "dropped"},
            "m-none": {"": "dropped", "ok": "dropped", "bad": "dropped", "off": "dropped"},
            "m-page": {"slow": "waiting"},
        }
        wait_for(lambda: all(store.states(m) == s for m, s in expected.items()), timeout=60)
        yield settings, store
    finally:
        worker.stop()


def test_trace_shows_every_state_and_the_journey_in_time_order(
    journeys: tuple[Settings, Store],
) -> None:
    settings, _ = journeys
    [order] = cli_json(settings, "trace", "m-order")
    assert (order["source"], order["call_type"], order["user_id"], order["event"]) == (
        "a",
        "track",
        "u1",
        "Order",
    )
    kinds = [(e["kind"], e.get("destination", "")) for e in order["entries"]]
    assert kinds[:2] == [("received", ""), ("routed", "")]
    assert set(kinds[2:]) == {
        ("dropped", "off"),
        ("attempt", "ok"),
        ("delivered", "ok"),
        ("attempt", "bad"),
        ("dead_lettered", "bad"),
    }
    times = [e["at"] for e in order["entries"]]
    assert times == sorted(times)
    bad_attempt = next(
        e for e in order["entries"] if e["kind"] == "attempt" and e["destination"] == "bad"
    )
    assert (bad_attempt["status"], bad_attempt["error"], bad_attempt["response"]) == (
        404,
        "client_error",
        "nope",
    )
    states = {d["destination"]: d for d in order["destinations"]}
    assert states["ok"]["state"] == "delivered" and states["ok"]["last_status"] == 200
    assert (states["bad"]["state"], states["bad"]["reason"]) == ("dead_lettered", "client_error")
    assert (states["off"]["state"], states["off"]["reason"]) == ("dropped", "destination_disabled")

    [page] = cli_json(settings, "trace", "m-page")
    [slow] = page["destinations"]
    assert (slow["state"], slow["tier"], slow["anonymous_id"]) == ("waiting", 0, "anon-3")
    assert slow["not_before"] > page["entries"][0]["at"]

    [debug] = cli_json(settings, "trace", "m-debug")
    assert [(d["state"], d["reason"]) for d in debug["destinations"]] == [
        ("dropped", "blocked_event")
    ]
    [none] = cli_json(settings, "trace", "m-none")
    reasons = {d["destination"]: d["reason"] for d in none["destinations"]}
    assert reasons == {
        "": "no_destination",
        "ok": "integrations",
        "bad": "integrations",
        "off": "destination_disabled",
    }

    text = run_cli(settings, "trace", "m-page")
    assert text.returncode == 0 and "waiting" in text.stdout and "tier 0" in text.stdout
    missing = run_cli(settings, "trace", "no-such-message")
    assert missing.returncode == 1 and "no-such-message" in missing.stderr


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            (),
            {
                "m-order/ok",
                "m-order/bad",
                "m-order/off",
                "m-debug/",
                "m-none/",
                "m-page/slow",
                "m-none/ok",
                "m-none/bad",
                "m-none/off",
            },
        ),
        (("--destination", "ok"), {"m-order/ok", "m-none/ok"}),
        (("--source", "b"), {"m-page/slow"}),
        (("--user", "anon-3"), {"m-page/slow"}),
        (("--user", "u2"), {"m-none/", "m-none/ok", "m-none/bad", "m-none/off"}),
        (("--type", "page"), {"m-page/slow"}),
        (("--state", "delivered"), {"m-order/ok"}),
        (("--state", "waiting"), {"m-page/slow"}),
        (("--state", "dead_lettered"), {"m-order/bad"}),
        (("--state", "failed"), {"m-order/bad", "m-page/slow"}),
        (("--state", "dropped", "--source", "a", "--type", "track"), {"m-order/off", "m-debug/"}),
        (("--until", "1d"), set()),
        (("--since", "1h", "--destination", "slow"), {"m-page/slow"}),
    ],
)
def test_log_filters(
    journeys: tuple[Settings, Store], flags: tuple[str, ...], expected: set[str]
) -> None:
    settings, _ = journeys
    rows = cli_json(settings, "log", *flags)
    assert {f"{r['message_id']}/{r['destination']}" for r in rows} == expected
    updated = [r["last_updated"] for r in rows]
    assert updated == sorted(updated, reverse=True)  # newest first


def test_log_limit_and_text(journeys: tuple[Settings, Store]) -> None:
    settings, _ = journeys
    assert len(cli_json(settings, "log", "--limit", "2")) == 2
    text = run_cli(settings, "log", "--state", "waiting")
    assert text.returncode == 0 and "m-page" in text.stdout and "slow" in text.stdout
    bad = run_cli(settings, "log", "--since", "yesterday")
    assert bad.returncode == 2 and "--since" in bad.stderr and "yesterday" in bad.stderr


def test_stats_per_destination(journeys: tuple[Settings, Store]) -> None:
    settings, _ = journeys
    stats = {row["destination"]: row for row in cli_json(settings, "stats", "--since", "1h")}
    assert (stats["ok"]["attempts"], stats["ok"]["delivered"], stats["ok"]["success_ratio"]) == (
        1,
        1,
        1.0,
    )
    assert (stats["bad"]["failed"], stats["bad"]["dead_lettered"], stats["bad"]["last_error"]) == (
        1,
        1,
        "client_error",
    )
    assert stats["bad"]["last_error_status"] == 404 and stats["bad"]["last_error_at"]
    assert (stats["slow"]["waiting"], stats["slow"]["success_ratio"]) == (1, 0.0)
    assert stats["ok"]["p50_ms"] is not None and stats["ok"]["p95_ms"] >= stats["ok"]["p50_ms"]
    assert list(stats)[0] in {"bad", "slow"}  # problems first
    # A window without attempts: only what waits now (whatever the window) is left.
    [idle] = cli_json(settings, "stats", "--since", "2d", "--until", "1d")
    assert (idle["destination"], idle["attempts"], idle["waiting"]) == ("slow", 0, 1)


def test_a_deletion_request_removes_the_users_calls_from_the_store(
    journeys: tuple[Settings, Store],
) -> None:
    settings, store = journeys
    assert store.log(user="u1")
    result = run_cli(settings, "delete-user", "u1")
    assert result.returncode == 0, result.stderr
    wait_for(lambda: store.trace("m-order") is not None and store.trace("m-order").purged_at)
    [order] = cli_json(settings, "trace", "m-order")
    assert order["purged_at"] and order["entries"] == [] and order["user_id"] is None
    text = run_cli(settings, "trace", "m-order").stdout
    assert "deletion request" in text
    left = {(r.message_id, r.call_type) for r in store.log(user="u1")}
    assert left and {call_type for _, call_type in left} == {"delete"}  # the request itself
    assert store.states("m-page") == {"slow": "waiting"}  # other users untouched


def test_with_the_log_off_nothing_is_logged(
    settings: Settings, receiver_factory: Callable[..., Receiver], tmp_path: Path
) -> None:
    receiver = receiver_factory()
    quiet = settings.replace(log=False, log_store_url=f"sqlite:///{tmp_path / 'log.sqlite3'}")
    apply(quiet, simple_config(receiver.url))
    worker = InProcessWorker(quiet, ("router", "deliver"))
    try:
        send_calls(quiet, [{"type": "identify", "userId": "u"}], "wk")
        wait_for(lambda: receiver.count() == 1)
    finally:
        worker.stop()
    assert topic_ends(quiet, topics_for(quiet).log) == {}  # no partition has a record


# ---- the log-store's own faults ------------------------------------------------------------------

CALLS = 400


def many_calls(count: int) -> list[dict[str, Any]]:
    return [
        {"type": "track", "event": "E", "userId": f"u{i % 20}", "messageId": f"m{i:05d}"}
        for i in range(count)
    ]


def store_counts(url: str) -> tuple[int, int]:
    """(journeys, entries) in the store: every call delivered once is one journey, four entries
    (received, routed, attempt, delivered)."""
    store = open_store(url)
    try:
        rows = store.log(LogQuery(limit=10_000))
        entries = sum(len(t.entries) for t in (store.trace(r.message_id) for r in rows) if t)
        return len(rows), entries
    finally:
        store.close()


def test_log_store_killed_and_restarted_loses_no_row_and_doubles_none(
    logged: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    receiver = receiver_factory()
    apply(logged, simple_config(receiver.url))
    worker = InProcessWorker(logged, ("router", "deliver"))
    try:
        send_calls(logged, many_calls(CALLS), "wk")
        wait_for(lambda: receiver.count() >= CALLS, timeout=60)
    finally:
        worker.stop()

    first, first_log = started(process_factory, logged, "log-store")
    store = Store(logged)
    wait_or_tell(
        lambda: len(store.log(limit=10_000)) >= CALLS // 4,
        60,
        {"log-store": first_log},
        lambda: "",
    )
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    _, second_log = started(process_factory, logged, "log-store")
    logs = {"killed": first_log, "restarted": second_log}
    wait_or_tell(
        lambda: store_counts(logged.log_store_url) == (CALLS, 4 * CALLS),
        60,
        logs,
        lambda: f"store: {store_counts(logged.log_store_url)}",
    )


def test_rebuild_writes_the_same_rows_again(
    logged: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    receiver = receiver_factory()
    apply(logged, simple_config(receiver.url))
    worker = InProcessWorker(logged, WORKER_ROLES)
    try:
        send_calls(logged, many_calls(50), "wk")
        wait_for(lambda: store_counts(logged.log_store_url) == (50, 200), timeout=60)
    finally:
        worker.stop()
    before = cli_json(logged, "trace", "m00007")
    rebuilt = process_factory(logged, "log-store", "--rebuild")
    log = Stderr(rebuilt)
    wait_or_tell(lambda: log.has("emptied"), 30, {"log-store": log}, lambda: "")
    wait_for(lambda: store_counts(logged.log_store_url) == (50, 200), timeout=60)
    assert cli_json(logged, "trace", "m00007") == before
    rebuilt.send_signal(signal.SIGTERM)


def test_delivery_goes_on_while_the_store_is_down_and_the_store_catches_up(
    logged: Settings,
    receiver_factory: Callable[..., Receiver],
    postgres_server: Any,
    postgres_url: str,
) -> None:
    """The store is a PostgreSQL database that does not exist yet: the worker delivers every call
    regardless; once the database is there, the log-store writes the whole log."""
    receiver = receiver_factory()
    missing = postgres_url.rsplit("/", 1)[0] + "/not_yet_" + logged.topic_prefix.strip(".")
    settings = logged.replace(log_store_url=missing)
    apply(settings, simple_config(receiver.url))
    worker = InProcessWorker(settings, WORKER_ROLES)
    try:
        send_calls(settings, many_calls(100), "wk")
        wait_for(lambda: receiver.count() >= 100, timeout=60)
        postgres_server.create_database(missing.rsplit("/", 1)[1])
        wait_for(lambda: store_counts(missing) == (100, 400), timeout=90)
    finally:
        worker.stop()


def children(pid: int) -> list[int]:
    """The PIDs of ``pid``'s child processes (Linux /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(child) for child in text]
    return found


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie not yet reaped counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_pipeline_worker_writes_the_log_through_a_log_store_process_beside_it(
    logged: Settings,
    receiver_factory: Callable[..., Receiver],
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    receiver = receiver_factory()
    apply(logged, simple_config(receiver.url))
    worker, worker_log = started(process_factory, logged, "worker")
    wait_or_tell(lambda: len(children(worker.pid)) == 1, 30, {"worker": worker_log}, lambda: "")
    [log_store] = children(worker.pid)
    send_calls(logged, many_calls(20), "wk")
    wait_for(lambda: store_counts(logged.log_store_url) == (20, 80), timeout=60)
    worker.send_signal(signal.SIGTERM)
    worker.wait(30)
    wait_for(lambda: gone(log_store), timeout=20)  # stopped with it


def test_a_worker_killed_takes_its_log_store_process_with_it(
    logged: Settings,
    process_factory: Callable[..., subprocess.Popen[bytes]],
) -> None:
    worker, worker_log = started(process_factory, logged, "worker")
    wait_or_tell(lambda: len(children(worker.pid)) == 1, 30, {"worker": worker_log}, lambda: "")
    [log_store] = children(worker.pid)
    worker.send_signal(signal.SIGKILL)
    worker.wait(10)
    wait_for(lambda: gone(log_store), timeout=20)
