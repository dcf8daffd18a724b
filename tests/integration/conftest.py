"""Fixtures of the integration tests: one embedded broker per xdist worker, everything else unique
per test (topic prefix, consumer groups, receivers on free ports, workers it starts itself).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from multidict import CIMultiDict

from pipeline.core.settings import Settings
from pipeline.http.ingest import IngestOptions
from pipeline.kafka.broker import EmbeddedBroker
from pipeline.kafka.clients import create_topics
from pipeline.runtime.net import free_port
from tests.support import (
    ROOT,
    SESSION_TIMEOUT,
    CallsTopic,
    IngestThread,
    InProcessWorker,
    Receiver,
    Request,
    SecuredBroker,
    ServerThread,
    apply,
    ingest_config,
    settings_env,
)
from tests.tls_proxy import Certificates, TlsProxy


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(port=0) as running:
        yield running


@pytest.fixture
def settings(broker: EmbeddedBroker, tmp_path: Path) -> Settings:
    """Settings for one test: a unique topic prefix, fast timings, topics created, the delivery
    log's store a file of the test's own."""
    return fresh_settings(broker, tmp_path)


@pytest.fixture(scope="module")
def module_settings(broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """``settings`` for the tests of a module that read what one run left (its own prefix)."""
    return fresh_settings(broker, tmp_path_factory.mktemp("module"))


def fresh_settings(broker: EmbeddedBroker, directory: Path) -> Settings:
    """A unique topic prefix, fast timings, topics created, files under ``directory``."""
    settings = Settings(
        bootstrap_servers=broker.bootstrap_servers,
        topic_prefix=f"t{uuid.uuid4().hex[:10]}.",
        partitions=3,
        retry_partitions=2,
        session_timeout=SESSION_TIMEOUT,
        retry_delays=(1.0, 2.0),
        retry_deadline=8.0,
        delivery_timeout=1.0,
        # The SSRF guard blocks loopback by default; test receivers live on 127.0.0.1.
        allowed_networks=("127.0.0.0/8",),
        # As `pipeline dev` on the embedded broker: its transactions can stall read_committed
        # readers (docs/decisions.md); the transaction tests turn them on themselves.
        transactions=False,
        circuit_cool_down=1.0,
        circuit_cool_down_max=1.0,  # never grows: tests time their probes (see test_circuit.py)
        log_store_url=f"sqlite:///{directory / 'log.sqlite3'}",
        state_dir=str(directory / "state"),
    )
    create_topics(settings)
    return settings


@pytest.fixture
def receiver_factory() -> Iterator[Callable[..., Receiver]]:
    yield from receivers()


@pytest.fixture(scope="module")
def module_receiver_factory() -> Iterator[Callable[..., Receiver]]:
    """``receiver_factory`` for a module's shared run."""
    yield from receivers()


def receivers() -> Iterator[Callable[..., Receiver]]:
    """Makes receivers on 127.0.0.1 (on one server thread), closed when it resumes."""
    server = ServerThread()

    def make(
        default: Any = 200,
        *,
        ssl_context: Any = None,
        path: str = "/hook",
        delay: float = 0.0,
    ) -> Receiver:
        """``delay``: seconds each request waits before it is answered (after it is recorded)."""
        receiver = Receiver(url="", default=default)

        async def handle(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            with receiver.lock:
                answer = receiver.responses.pop(0) if receiver.responses else receiver.default
                if callable(answer):  # answer by the request's body
                    answer = answer(body)
                receiver.requests.append(
                    Request(request.path, CIMultiDict(request.headers), body, time.time(), answer)
                )
            if answer == "hang":
                await asyncio.sleep(3600)
            if delay:
                await asyncio.sleep(delay)
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


#: ``python -m pipeline ARGS``, with SIGINT raising ``KeyboardInterrupt`` as at a terminal. A
#: process started by one that ignores SIGINT ignores it too (POSIX; Python then installs no
#: handler). In full runs the interrupted replay's Ctrl-C was lost three times in a row (the
#: child ran to its end, exit 0) while the test passed alone: its worker ignored SIGINT by then.
_PIPELINE_WITH_CTRL_C = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'pipeline'; runpy.run_module('pipeline', run_name='__main__')"
)


@pytest.fixture
def process_factory() -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """``python -m pipeline ARGS`` as a subprocess; killed by PID at the end of the test."""
    processes: list[subprocess.Popen[bytes]] = []

    def start(
        settings: Settings, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-c", _PIPELINE_WITH_CTRL_C, *args],
            env={**settings_env(settings), **(env or {})},
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


@pytest.fixture
def ingest_factory() -> Iterator[Callable[..., IngestThread]]:
    started: list[IngestThread] = []

    def make(settings: Settings, options: IngestOptions | None = None) -> IngestThread:
        server = IngestThread(settings, options)
        started.append(server)
        server.wait_ready()
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def calls_topic(settings: Settings) -> Iterator[CallsTopic]:
    reader = CallsTopic(settings)
    yield reader
    reader.close()


@pytest.fixture(scope="module")
def shared_settings(broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """One topic prefix, config and ingest server for a whole module (they take seconds to
    start); tests keep apart by tagging their user ids (``tag``, ``tagged_calls``)."""
    settings = Settings(
        bootstrap_servers=broker.bootstrap_servers,
        topic_prefix=f"m{uuid.uuid4().hex[:10]}.",
        partitions=3,
        retry_partitions=1,
        session_timeout=SESSION_TIMEOUT,
        transactions=False,  # as in ``settings``
        log_store_url=f"sqlite:///{tmp_path_factory.mktemp('log') / 'log.sqlite3'}",
        state_dir=str(tmp_path_factory.mktemp("state")),
    )
    create_topics(settings)
    apply(settings, ingest_config())
    return settings


@pytest.fixture(scope="module")
def ingest(shared_settings: Settings) -> Iterator[IngestThread]:
    server = IngestThread(shared_settings)
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture
def tag() -> str:
    """A unique prefix for the user ids of one test."""
    return f"u{uuid.uuid4().hex[:8]}-"


@pytest.fixture
def tagged_calls(shared_settings: Settings, tag: str) -> Iterator[CallsTopic]:
    reader = CallsTopic(shared_settings, tag)
    yield reader
    reader.close()


# ---- PostgreSQL (the log store's server backend) ----
# One server per xdist worker, started the first time a test asks for it (tests/pg_server.py);
# a fresh database per test.


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    from tests.pg_server import start_postgres

    server = start_postgres()
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server: Any) -> Iterator[str]:
    name = f"t{uuid.uuid4().hex[:12]}"
    yield postgres_server.create_database(name)
    postgres_server.drop_database(name)


# ---- secured Kafka: the embedded broker behind a TLS proxy, or with SASL required ----


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return Certificates.make(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def secured_broker_factory(
    certificates: Certificates, tmp_path: Path
) -> Iterator[Callable[..., SecuredBroker]]:
    """Brokers of the test's own: ``tls`` puts stunnel in front (the broker advertises the
    proxy's port, so every client talks TLS), ``client_cert`` makes the proxy require a client
    certificate of the test CA, ``authentication`` makes the broker require SASL (SCRAM; this
    build knows no user, so every login is refused)."""
    started: list[Any] = []

    def make(
        *, tls: bool = True, client_cert: bool = False, authentication: bool = False
    ) -> SecuredBroker:
        tls_port = free_port() if tls else None
        broker = EmbeddedBroker(
            port=0, advertised_port=tls_port, authentication=authentication
        ).start()
        started.append(broker)
        if tls_port is None:
            return SecuredBroker(broker.bootstrap_servers, certificates, broker)
        proxy = TlsProxy(
            tls_port, broker.port, certificates, require_client_cert=client_cert, folder=tmp_path
        ).start()
        started.append(proxy)
        return SecuredBroker(f"127.0.0.1:{tls_port}", certificates, broker)

    yield make
    for process in reversed(started):
        process.stop()
