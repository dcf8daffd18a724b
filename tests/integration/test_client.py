"""The client library, for real: one contract, run against both clients over both transports.

``ClientContract`` holds every test; ``TestHttpTransport`` runs it through the ingestion API
(in-process, on 127.0.0.1) and ``TestKafkaTransport`` straight to the broker. Both end at the
calls topic, which is where the tests look. Every test that makes its client with ``new_client``
or ``make_client`` runs twice, as ``[Client]`` and ``[AsyncClient]`` (the latter on an event loop
of its own, through ``LoopClient``); the fork and interpreter-exit tests are ``Client``'s alone.
Tests share one topic prefix per module and keep apart by tagging their user ids.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from pipeline.client import (
    AsyncClient,
    CallTooLarge,
    Client,
    ClientClosed,
    DeliveryError,
    InvalidCall,
    QueueFull,
)
from pipeline.client import __all__ as client_all
from pipeline.client._messages import build_message
from pipeline.core.calls import MAX_CALL_BYTES
from pipeline.core.timestamps import now_ms, parse_timestamp
from pipeline.runtime.net import free_port
from tests.support import ROOT, SOURCE_ID, WRITE_KEY, IngestThread, wait_for

# Fixtures shared with test_ingest.py: one topic prefix, config and ingest server per module.

MakeClient = Callable[..., Any]  # a Client, or a LoopClient over an AsyncClient

#: The call methods a LoopClient runs on its loop.
CALL_METHODS = frozenset({"identify", "track", "page", "screen", "group", "alias"})


class LoopClient:
    """An ``AsyncClient`` driven from synchronous test code, so the contract runs unchanged: it
    lives on an event loop of its own in a thread, and every call, flush and close runs on that
    loop (an ``AsyncClient`` is used from its loop only); everything else is read through."""

    def __init__(self, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

        async def make() -> AsyncClient:
            return AsyncClient(**kwargs)

        self._client = self._run(make())

    def _run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._client, name)
        if name not in CALL_METHODS:
            return value

        def call(*args: Any, **kwargs: Any) -> None:
            async def on_loop() -> None:
                value(*args, **kwargs)

            self._run(on_loop())

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._client, name, value)

    def flush(self, timeout: float | None = None) -> bool:
        return bool(self._run(self._client.flush(timeout)))

    def close(self, timeout: float | None = None) -> bool:
        return bool(self._run(self._client.close(timeout)))

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


def test_public_names():
    assert sorted(client_all) == sorted(
        [
            "DEFAULT_ENDPOINT",
            "AsyncClient",
            "Backoff",
            "CallTooLarge",
            "Client",
            "ClientClosed",
            "ClientError",
            "DeliveryError",
            "InvalidCall",
            "OnError",
            "QueueFull",
        ]
    )


class ClientContract:
    """What every transport must do. Subclasses provide ``transport_kwargs`` and
    ``unreachable_kwargs`` fixtures (a transport whose every send fails, retryably)."""

    @pytest.fixture(params=["Client", "AsyncClient"])
    def new_client(self, request: pytest.FixtureRequest) -> Iterator[MakeClient]:
        """Makes the client under test (the caller closes it)."""
        loops: list[LoopClient] = []

        def new(**kwargs: Any) -> Any:
            if request.param == "Client":
                return Client(**kwargs)
            loops.append(LoopClient(**kwargs))
            return loops[-1]

        yield new
        for loop in loops:
            loop.stop()

    @pytest.fixture
    def make_client(
        self, new_client: MakeClient, transport_kwargs: dict[str, Any]
    ) -> Iterator[MakeClient]:
        clients: list[Any] = []

        def make(**kwargs: Any) -> Any:
            client = new_client(**{**transport_kwargs, **kwargs})
            clients.append(client)
            return client

        yield make
        for client in clients:
            client.close(timeout=2)

    # ---- batching --------------------------------------------------------------------------------

    def test_defaults_and_a_flush_at_20(self, make_client, tagged_calls, tag):
        default = make_client()
        assert (default.flush_at, default.size, default.flush_after) == (20, 20, 5.0)
        assert default.options.max_queue_size == 100_000
        client = make_client(flush_after=60)
        for n in range(19):
            client.track(f"{tag}{n % 3}", "Batched", {"n": n})
        assert tagged_calls.settle(0.8) == [] and client.batches == 0 and client.queued == 19
        client.track(f"{tag}0", "Batched", {"n": 19})  # the 20th call: a flush, at once
        records = tagged_calls.wait(20, timeout=10)
        # The records reach the topic before the client has read the API's answer: poll.
        wait_for(lambda: client.batches == 1 and client.sent == 20, timeout=5)
        assert client.queued == 0
        assert sorted(orjson.loads(r["properties"])["n"] for r in records) == list(range(20))

    def test_a_flush_after_flush_after_seconds_with_the_call_time_kept(
        self, make_client, tagged_calls, tag
    ):
        client = make_client(flush_after=0.6)
        called = now_ms()
        started = time.monotonic()
        for n in range(3):
            client.track(f"{tag}{n}", "Timed")
        client.track(f"{tag}h", "Historical", timestamp="2020-01-02T03:04:05.678Z")
        records = tagged_calls.wait(4, timeout=10)
        waited = time.monotonic() - started
        assert 0.5 <= waited <= 10.0, waited  # not before flush_after; the top is for slow CI
        wait_for(lambda: client.sent == 4, timeout=5)
        assert client.batches == 1
        for record in records:
            if record["event"] == "Historical":  # an explicit timestamp is kept as it is
                assert record["timestamp"] == parse_timestamp("2020-01-02T03:04:05.678Z")
            else:  # the call time, not the flush time (clock skew corrected on the server)
                # (the flush time would be 600 ms or more after it)
                assert abs(record["timestamp"] - called) < 450, record["timestamp"] - called
                assert record["receivedAt"] >= called + 500
            assert record["sourceId"] == SOURCE_ID

    def test_flush_at_1_sends_every_call_at_once(self, make_client, tagged_calls, tag):
        client = make_client(size=1, flush_after=60)
        assert client.flush_at == 1
        client.identify(f"{tag}1", {"plan": "pro"})
        tagged_calls.wait(1, timeout=3)
        client.track(f"{tag}1", "Second")
        tagged_calls.wait(2, timeout=3)
        wait_for(lambda: client.sent == 2, timeout=5)
        assert client.batches == 2

    def test_flush_and_close_deliver_everything_from_many_threads(
        self, make_client, tagged_calls, tag
    ):
        client = make_client(flush_after=60)

        def burst(thread: int) -> None:
            for n in range(60):
                client.track(f"{tag}{thread}", "Burst", {"n": n})

        threads = [threading.Thread(target=burst, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        client.identify(f"{tag}a", {"name": "Ada"})
        client.page(f"{tag}a", name="Home", category="Docs", properties={"path": "/"})
        client.screen(f"{tag}a", name="Settings")
        client.group(f"{tag}a", "acme", {"employees": 12})
        client.alias(f"{tag}old", f"{tag}a")
        assert client.flush(timeout=15) is True
        assert client.queued == 0 and client.sent == 245
        records = tagged_calls.wait(245)
        assert len({r["messageId"] for r in records}) == 245
        for n in range(7):  # fewer than flush_at, and flush_after is far: only close sends them
            client.track(f"{tag}c", "At Close", {"n": n})
        errors: list[Any] = []
        client.on_error = lambda error, messages: errors.append((error, messages))
        assert client.close(timeout=15) is True
        assert len(tagged_calls.wait(252)) == 252
        assert {r["type"] for r in records} == {
            "track",
            "identify",
            "page",
            "screen",
            "group",
            "alias",
        }
        client.track(f"{tag}late", "After Close")
        assert client.dropped == 1 and isinstance(errors[0][0], ClientClosed)
        assert errors[0][1][0]["event"] == "After Close"
        assert client.close() is True  # again: nothing to do
        assert len(tagged_calls.settle(0.3)) == 252

    # ---- limits ----------------------------------------------------------------------------------

    def test_invalid_calls_raise_at_once_naming_the_field(self, make_client, tagged_calls, tag):
        client = make_client(flush_after=60)
        cases: list[tuple[Callable[[], None], str]] = [
            (lambda: client.track(f"{tag}1"), "event"),
            (lambda: client.track(event="No User"), "userId"),
            (lambda: client.group(f"{tag}1"), "groupId"),
            (lambda: client.alias(user_id=f"{tag}1"), "previousId"),
            (lambda: client.track(f"{tag}1", "E", properties=["a"]), "properties"),  # type: ignore[arg-type]
            (lambda: client.track(f"{tag}1", "E", timestamp="noon"), "timestamp"),
            (lambda: client.track(f"{tag}1", "E", {"at": object()}), "properties"),
        ]
        for make_call, field in cases:
            with pytest.raises(InvalidCall) as raised:
                make_call()
            assert raised.value.field == field, raised.value
        with pytest.raises(CallTooLarge) as too_large:
            client.track(f"{tag}1", "Huge", {"blob": "x" * 33_000})
        assert "over the limit of 32,768 bytes" in str(too_large.value)
        assert client.queued == 0
        # Exactly 32,768 bytes: the client and the API measure the same bytes and both accept.
        message_id = (tag + "m" * 36)[:36]
        empty = build_message(
            "track",
            user_id=f"{tag}1",
            event="At The Limit",
            properties={"blob": ""},
            message_id=message_id,
            now=0,
        )
        blob = "x" * (MAX_CALL_BYTES - len(orjson.dumps(empty)))
        with pytest.raises(CallTooLarge, match="is 32,769 bytes"):
            client.track(f"{tag}1", "At The Limit", {"blob": blob + "x"}, message_id=message_id)
        client.track(f"{tag}1", "At The Limit", {"blob": blob}, message_id=message_id)
        assert client.flush(timeout=10)
        assert [r["event"] for r in tagged_calls.wait(1)] == ["At The Limit"]

    def test_batches_are_split_at_500_kb(self, make_client, tagged_calls, tag):
        client = make_client(flush_at=40, flush_after=60)
        for n in range(40):  # 40 × 30 KB = 1.2 MB: three batches at least
            client.track(f"{tag}{n}", "Big", {"blob": "x" * 30_000, "n": n})
        assert client.flush(timeout=20) is True
        assert len(tagged_calls.wait(40)) == 40
        assert client.batches == 3 and client.failed == 0

    # ---- processes and failures ------------------------------------------------------------------

    def test_fork_gives_the_child_a_fresh_queue_and_the_parent_keeps_working(
        self, transport_kwargs, tagged_calls, tag
    ):
        # A fresh interpreter plays the pre-fork server (gunicorn, celery): forking this pytest
        # process, full of other librdkafka clients' threads, would test librdkafka, not us.
        report = run_client_script(FORK_SCRIPT, transport_kwargs, tag)
        assert report == {
            "child": [0, True, 1],  # the child started empty and delivered its own call
            "parent": [True, 3],  # the parent delivered what it queued before and after
        }
        tagged_calls.wait(4)
        events = sorted(r["event"] for r in tagged_calls.settle(0.5))
        assert events == ["After Fork", "Before Fork", "In Child", "Warm Up"]  # each once

    def test_a_full_queue_drops_counts_and_reports_and_never_blocks(
        self, new_client, unreachable_kwargs, tag
    ):
        errors: list[tuple[Exception, list[dict[str, Any]]]] = []
        client = new_client(
            **unreachable_kwargs,
            flush_at=1,
            max_queue_size=5,
            max_retries=1000,
            on_error=lambda error, messages: errors.append((error, messages)),
        )
        try:
            client.track(f"{tag}first", "In Flight")
            wait_for(lambda: client.queued == 0, timeout=5)  # the worker holds it, retrying
            started = time.monotonic()
            for n in range(40):
                client.track(f"{tag}{n}", "Dropped?")
            assert time.monotonic() - started < 2.0  # the caller never waits (~1 ms when idle)
            assert (client.queued, client.dropped, client.sent) == (5, 35, 0)
            full = [(e, m) for e, m in errors if isinstance(e, QueueFull)]
            assert len(full) == 35
            assert [m[0]["userId"] for _, m in full] == [f"{tag}{n}" for n in range(5, 40)]
            assert str(full[0][0]) == (
                "the queue is full (5 calls waiting, max_queue_size); the call was dropped"
            )
        finally:
            closed_at = time.monotonic()
            assert client.close(timeout=0.5) is False
            assert time.monotonic() - closed_at < 3
        # The in-flight call and the five queued ones are reported as undelivered at close.
        wait_for(lambda: client.failed == 6, timeout=15)

        def closed_calls() -> list[dict[str, Any]]:  # on_error runs just after the count
            return [m for e, ms in errors if isinstance(e, ClientClosed) for m in ms]

        closed = wait_for(lambda: len(closed_calls()) == 6 and closed_calls(), timeout=5)
        assert sorted(m["userId"] for m in closed) == sorted(
            [f"{tag}first"] + [f"{tag}{n}" for n in range(5)]
        )

    def test_debug_logging_and_delivery_at_interpreter_exit(
        self, transport_kwargs, tagged_calls, tag
    ):
        logged = run_client_script(EXIT_SCRIPT, transport_kwargs, tag + "1", DEBUG="analytics")
        assert "DEBUG pipeline.client: queued track" in logged
        assert "DEBUG pipeline.client: delivered 1 calls" in logged
        assert "pipeline.client" not in run_client_script(EXIT_SCRIPT, transport_kwargs, tag + "2")
        # Neither script flushed or closed: the atexit hook delivered their calls.
        assert sorted(r["userId"] for r in tagged_calls.wait(2)) == [tag + "1", tag + "2"]

    def test_async_client(self, transport_kwargs, tagged_calls, tag):
        async def main() -> tuple[int, bool, bool, int]:
            async with AsyncClient(**transport_kwargs, flush_after=60) as client:
                for n in range(20):
                    client.track(f"{tag}{n}", "Async", {"n": n})
                for _ in range(200):  # the 20th call flushes by itself
                    if client.sent == 20:
                        break
                    await asyncio.sleep(0.05)
                sent_alone = client.sent
                for n in range(20, 25):
                    client.track(f"{tag}{n}", "Async", {"n": n})
                flushed = await client.flush(timeout=15)
                client.identify(f"{tag}x", {"a": 1})
                closed = await client.close(timeout=15)
                return sent_alone, flushed, closed, client.batches

        sent_alone, flushed, closed, batches = asyncio.run(main())
        assert sent_alone == 20 and flushed and closed
        assert batches == 3  # 20 at flush_at, 5 at flush(), 1 at close()
        assert len(tagged_calls.wait(26)) == 26


FORK_SCRIPT = """
import json, os, select, sys
from pipeline.client import Client

client = Client(**json.loads(os.environ["CLIENT_KWARGS"]), flush_at=100, flush_after=60)
tag = os.environ["TAG"]
client.track(tag + "w", "Warm Up")
assert client.flush(timeout=15)  # the transport is live (connections, threads) at the fork
client.track(tag + "p", "Before Fork")  # queued in the parent only
read_end, write_end = os.pipe()
pid = os.fork()
if pid == 0:
    code = 1
    try:
        queued = client.queued
        client.track(tag + "c", "In Child")
        delivered = client.flush(timeout=15)
        os.write(write_end, json.dumps([queued, delivered, client.sent]).encode())
        code = 0
    finally:
        os._exit(code)
os.close(write_end)
ready = select.select([read_end], [], [], 30)[0]
child = json.loads(os.read(read_end, 1000) or b"null") if ready else None
os.waitpid(pid, 0)
client.track(tag + "p", "After Fork")
delivered = client.flush(timeout=15)
client.close()
print(json.dumps({"child": child, "parent": [delivered, client.sent]}))
"""

EXIT_SCRIPT = """
import json, os
from pipeline.client import Client

client = Client(**json.loads(os.environ["CLIENT_KWARGS"]), flush_after=60)
client.track(os.environ["TAG"], "At Exit")  # no flush, no close: the interpreter exits
"""


def run_client_script(script: str, kwargs: dict[str, Any], tag: str, **env: str) -> Any:
    """Run ``script`` in a fresh interpreter; its stdout as JSON if it printed any, else stderr."""
    environ = {k: v for k, v in os.environ.items() if k != "DEBUG"}
    environ.update(CLIENT_KWARGS=json.dumps(kwargs), TAG=tag, **env)
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=environ,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else done.stderr


class TestHttpTransport(ClientContract):
    @pytest.fixture
    def transport_kwargs(self, ingest: IngestThread) -> dict[str, Any]:
        return {"write_key": WRITE_KEY, "endpoint": ingest.url}

    @pytest.fixture
    def unreachable_kwargs(self) -> dict[str, Any]:
        return {"write_key": WRITE_KEY, "endpoint": f"http://127.0.0.1:{free_port()}"}

    def test_retries_503_then_429_with_retry_after_then_200(self, new_client, receiver_factory):
        api = receiver_factory(path="")
        api.responses = [503, (429, {"Retry-After": "1"}), 200]
        client = new_client(write_key=WRITE_KEY, endpoint=api.url, flush_after=60)
        try:
            client.track("u1", "Retried", message_id="m-retried")
            client.track("u2", "Retried", message_id="m-retried-2")
            assert client.flush(timeout=20) is True
        finally:
            client.close(timeout=5)
        assert api.count() == 3 and client.sent == 2 and client.failed == 0
        first, second, third = api.requests
        assert third.at - second.at >= 0.95  # Retry-After: 1 was honoured
        # The receiver's aiohttp inflated the gzip bodies (it refuses a body that is not gzip).
        bodies = [orjson.loads(r.body) for r in api.requests]
        assert [[m["messageId"] for m in b["batch"]] for b in bodies] == [
            ["m-retried", "m-retried-2"]
        ] * 3  # the same calls, the same ids: receivers dedupe
        assert all(b["writeKey"] == WRITE_KEY for b in bodies)
        for request in api.requests:
            assert request.path == "/v1/batch"
            assert request.headers["Content-Encoding"] == "gzip"
            assert (
                request.headers["Authorization"]
                == "Basic " + base64.b64encode(f"{WRITE_KEY}:".encode()).decode()
            )
            assert request.headers["User-Agent"].startswith("pipeline-python/")

    def test_a_refused_batch_is_not_retried_and_is_reported(self, new_client, receiver_factory):
        api = receiver_factory(path="")
        api.default = 400
        errors: list[Any] = []
        client = new_client(
            write_key=WRITE_KEY,
            endpoint=api.url,
            gzip=False,
            on_error=lambda error, messages: errors.append((error, messages)),
        )
        try:
            client.track("u1", "Refused")
            assert client.flush(timeout=10) is False
        finally:
            client.close(timeout=5)
        assert api.count() == 1 and client.failed == 1
        error, messages = errors[0]
        assert isinstance(error, DeliveryError) and error.status == 400 and not error.retryable
        assert messages[0]["event"] == "Refused"
        assert orjson.loads(api.requests[0].body)["batch"][0]["event"] == "Refused"


class TestKafkaTransport(ClientContract):
    @pytest.fixture
    def transport_kwargs(self, shared_settings) -> dict[str, Any]:
        return {
            "write_key": "",
            "bootstrap_servers": shared_settings.bootstrap_servers,
            "topic_prefix": shared_settings.topic_prefix,
            "source_id": SOURCE_ID,
        }

    @pytest.fixture
    def unreachable_kwargs(self, shared_settings) -> dict[str, Any]:
        return {
            "write_key": "",
            "bootstrap_servers": f"127.0.0.1:{free_port()}",
            "source_id": SOURCE_ID,
            "timeout": 1.0,
        }

    def test_the_kafka_transport_needs_a_source_id(self, shared_settings):
        with pytest.raises(ValueError, match="source_id: is required with bootstrap_servers"):
            Client("", bootstrap_servers=shared_settings.bootstrap_servers)
