"""The delivery log's shared scenario: four calls of two sources through a real worker, each
left in a final or waiting state in the store, for the tests of ``trace``, ``log`` and ``stats``
(tests/integration/test_log_commands.py) and of the deletion purge."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.core.settings import Settings
from pipeline.store import LogQuery, open_store
from tests.support import InProcessWorker, Receiver, apply, run_cli, send_calls, wait_for

WORKER_ROLES = ("router", "deliver", "retry", "log-store")


def logged(settings: Settings, directory: Path) -> Settings:
    """``settings`` with the delivery log on and its store a file in ``directory``."""
    return settings.replace(log=True, log_store_url=f"sqlite:///{directory / 'log.sqlite3'}")


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


@contextmanager
def journeys(
    logged: Settings, receiver_factory: Callable[..., Receiver]
) -> Iterator[tuple[Settings, Store]]:
    """The four calls of ``two_sources`` sent through a worker, each in its final or waiting
    state in the store; the worker runs until the block ends."""
    ok, bad, failing = receiver_factory(200), receiver_factory(404), receiver_factory(500)
    # The 500s wait in tier 0 for the whole of the tests that read them.
    settings = logged.replace(retry_delays=(600.0,), retry_deadline=1200.0)
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
