"""Shared fixtures: one embedded broker per test session, everything else unique per test.

Each test gets its own topic prefix (and so its own consumer groups, see ``pipeline.roles.worker``),
its own receivers on free 127.0.0.1 ports, and workers it starts and stops itself.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from pipeline.core.config import validate_config
from pipeline.core.settings import Settings
from pipeline.kafka.broker import EmbeddedBroker
from pipeline.kafka.clients import create_topics
from pipeline.kafka.config_store import apply_config
from pipeline.roles.worker import run_roles

ROOT = Path(__file__).resolve().parent.parent


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s: {predicate}")
        time.sleep(interval)


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(port=0) as running:
        yield running


@pytest.fixture
def settings(broker: EmbeddedBroker) -> Settings:
    """Settings for one test: a unique topic prefix, fast timings, topics created."""
    settings = Settings(
        bootstrap_servers=broker.bootstrap_servers,
        topic_prefix=f"t{uuid.uuid4().hex[:10]}.",
        partitions=3,
        retry_partitions=2,
        session_timeout=6.0,
        retry_delays=(1.0, 2.0),
        retry_deadline=8.0,
        delivery_timeout=1.0,
        # The SSRF guard blocks loopback by default; test receivers live on 127.0.0.1.
        allowed_networks=("127.0.0.0/8",),
        circuit_cool_down=1.0,
    )
    create_topics(settings)
    return settings


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a ``pipeline`` subprocess the same settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env.update(
        PIPELINE_BOOTSTRAP_SERVERS=settings.bootstrap_servers,
        PIPELINE_TOPIC_PREFIX=settings.topic_prefix,
        PIPELINE_PARTITIONS=str(settings.partitions),
        PIPELINE_RETRY_PARTITIONS=str(settings.retry_partitions),
        PIPELINE_SESSION_TIMEOUT=f"{settings.session_timeout}s",
        PIPELINE_RETRY_DELAYS=",".join(f"{d}s" for d in settings.retry_delays),
        PIPELINE_RETRY_DEADLINE=f"{settings.retry_deadline}s",
        PIPELINE_DELIVERY_TIMEOUT=f"{settings.delivery_timeout}s",
        PIPELINE_ALLOWED_NETWORKS=",".join(settings.allowed_networks),
        PIPELINE_CIRCUIT_FAILURES=str(settings.circuit_failures),
        PIPELINE_CIRCUIT_COOL_DOWN=f"{settings.circuit_cool_down}s",
    )
    return env


def run_cli(
    settings: Settings, *args: str, input: bytes | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m pipeline ARGS`` with the test's settings."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        input=input.decode() if input is not None else None,
        capture_output=True,
        text=True,
        env=settings_env(settings),
        timeout=timeout,
        cwd=ROOT,
    )


def apply(settings: Settings, config: dict[str, Any]) -> None:
    apply_config(settings, validate_config(config))


# ---- receivers ------------------------------------------------------------------------------------


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float
    answer: Any = None

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)


@dataclass
class Receiver:
    """A real HTTP server on 127.0.0.1 whose answers a test scripts.

    ``responses`` is consumed one per request (status, or (status, headers), or "hang", or a
    function of the request body giving one of those); when it is empty every request gets
    ``default``.
    """

    url: str
    requests: list[Request] = field(default_factory=list)
    responses: list[Any] = field(default_factory=list)
    default: Any = 200
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bodies(self) -> list[Any]:
        with self.lock:
            return [r.json for r in self.requests]

    def count(self) -> int:
        with self.lock:
            return len(self.requests)

    def delivered(self) -> list[Any]:
        """Bodies of the requests this receiver answered with a 2xx."""
        with self.lock:
            return [r.json for r in self.requests if isinstance(r.answer, int) and r.answer < 300]


class _ServerThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runners: list[web.AppRunner] = []

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def close(self) -> None:
        for runner in self.runners:
            self.run(runner.cleanup())

        async def cancel_rest() -> None:  # handlers still hanging on purpose
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(cancel_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def by_attempt(*first: int, then: int) -> Callable[[bytes], int]:
    """Answers per messageId: ``first`` to its first requests in turn, ``then`` to the rest (so
    the script holds whatever order concurrent requests arrive in)."""
    seen: dict[str, int] = {}

    def answer(body: bytes) -> int:
        message_id = orjson.loads(body)["messageId"]
        n = seen[message_id] = seen.get(message_id, 0) + 1
        return first[n - 1] if n <= len(first) else then

    return answer


@pytest.fixture
def receiver_factory() -> Iterator[Callable[..., Receiver]]:
    server = _ServerThread()

    def make(default: Any = 200, *, ssl_context: Any = None, path: str = "/hook") -> Receiver:
        receiver = Receiver(url="", default=default)

        async def handle(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            with receiver.lock:
                answer = receiver.responses.pop(0) if receiver.responses else receiver.default
                if callable(answer):  # answer by the request's body
                    answer = answer(body)
                receiver.requests.append(
                    Request(request.path, dict(request.headers), body, time.time(), answer)
                )
            if answer == "hang":
                await asyncio.sleep(3600)
            status, headers = answer if isinstance(answer, tuple) else (answer, {})
            return web.Response(
                status=status, text="ok" if status < 300 else "nope", headers=headers
            )

        async def start() -> str:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", handle)
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
            await site.start()
            server.runners.append(runner)
            port = runner.addresses[0][1]
            scheme = "https" if ssl_context is not None else "http"
            return f"{scheme}://127.0.0.1:{port}{path}"

        receiver.url = server.run(start())
        return receiver

    yield make
    server.close()


# ---- workers -------------------------------------------------------------------------------------


class InProcessWorker:
    """``run_roles`` on its own event loop in a background thread."""

    def __init__(self, settings: Settings, roles: tuple[str, ...]) -> None:
        self.loop = asyncio.new_event_loop()
        self.stop_event = asyncio.Event()
        self.ready = threading.Event()
        self.error: BaseException | None = None

        async def main() -> None:
            ready = asyncio.Event()
            task = asyncio.create_task(run_roles(settings, roles, self.stop_event, ready=ready))
            await ready.wait()
            self.ready.set()
            await task

        def target() -> None:
            try:
                self.loop.run_until_complete(main())
            except BaseException as exc:  # surfaced by stop()
                self.error = exc
                self.ready.set()
            finally:
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
                self.loop.close()

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()
        self.ready.wait(60)
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.stop_event.set)
            self.thread.join(30)
        if self.error is not None:
            raise self.error


@pytest.fixture
def worker_factory() -> Iterator[Callable[..., InProcessWorker]]:
    workers: list[InProcessWorker] = []

    def make(
        settings: Settings, roles: tuple[str, ...] = ("router", "deliver", "retry")
    ) -> InProcessWorker:
        worker = InProcessWorker(settings, roles)
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.stop()


@pytest.fixture
def process_factory() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """``python -m pipeline ARGS`` as a subprocess; killed by PID at the end of the test."""
    processes: list[subprocess.Popen[bytes]] = []

    def start(settings: Settings, *args: str) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipeline", *args],
            env=settings_env(settings),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        processes.append(process)
        return process

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        if process.stderr is not None:
            process.stderr.close()


def send_calls(settings: Settings, calls: list[dict[str, Any]], write_key: str) -> None:
    """Produce calls the way ``pipeline send`` does (in-process)."""
    from pipeline.ops.send import send_lines

    summary = send_lines(
        settings, [orjson.dumps(c) for c in calls], write_key=write_key, progress=False
    )
    assert summary.ok, summary.rejected
    assert summary.sent == len(calls)


def read_topic(
    settings: Settings, topic: str, schema: str, count: int, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """Read ``count`` Avro records of ``topic`` from the beginning (fails after ``timeout``)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from pipeline.kafka.clients import consumer_config
    from pipeline.kafka.codec import Codec

    consumer = Consumer(consumer_config(settings, f"reader-{uuid.uuid4().hex[:8]}"))
    metadata = consumer.list_topics(topic, timeout=10)
    partitions = sorted(metadata.topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    codec = Codec.default()
    records: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(records) < count and time.monotonic() < deadline:
            for message in consumer.consume(100, 0.2):
                if message.error() is None:
                    records.append(codec.decode(schema, message.value()))
    finally:
        consumer.close()
    assert len(records) >= count, f"{topic}: {len(records)} records, expected {count}"
    return records


def dead_letters(settings: Settings, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    from pipeline.kafka.clients import topics_for

    return read_topic(settings, topics_for(settings).dlq, "DeadLetter", count, timeout)


def stays(predicate: Callable[[], bool], seconds: float = 1.5) -> bool:
    """True if ``predicate`` holds for ``seconds`` (to assert that something does NOT happen)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not predicate():
            return False
        time.sleep(0.05)
    return True


def simple_config(*urls: str, secret: str | None = None, **destination: Any) -> dict[str, Any]:
    """Source ``web`` (write key ``wk``) → destination ``hooks`` (name ``Webhooks``) → ``urls``."""
    dest: dict[str, Any] = {
        "id": "hooks",
        "name": "Webhooks",
        "sources": ["web"],
        "webhooks": [{"url": url} for url in urls],
    }
    if secret is not None:
        dest["shared_secret"] = secret
    dest.update(destination)
    return {"sources": [{"id": "web", "write_keys": ["wk"]}], "destinations": [dest]}
