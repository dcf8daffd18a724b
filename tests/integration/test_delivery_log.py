"""The delivery log end to end: calls through a real worker (router, deliver, retry, log-store),
real receivers, the store on a real file: the deletion purge, the log off, and the log-store's
own faults: killed and restarted, rebuilt, and its store down while calls are delivered. (What
``trace``, ``log`` and ``stats`` read of one run: tests/integration/test_log_commands.py.)
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.settings import Settings
from pipeline.kafka.clients import topics_for
from pipeline.store import LogQuery, open_store
from tests.integration import log_journeys
from tests.integration.log_journeys import WORKER_ROLES, Store, cli_json
from tests.integration.log_journeys import journeys as run_journeys
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


@pytest.fixture
def logged(settings: Settings, tmp_path: Path) -> Settings:
    """The test's settings with the delivery log on and its store in the test's directory."""
    return log_journeys.logged(settings, tmp_path)


@pytest.fixture
def journeys(
    logged: Settings, receiver_factory: Callable[..., Receiver]
) -> Iterator[tuple[Settings, Store]]:
    """The shared scenario (``log_journeys``), for a test that changes what it left."""
    with run_journeys(logged, receiver_factory) as run:
        yield run


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
        try:
            text = (task / "children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):  # a thread that ended meanwhile
            continue
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
