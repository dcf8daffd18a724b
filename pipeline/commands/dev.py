"""``pipeline dev``: the whole pipeline on one machine, in one command.

Starts the embedded broker, creates the topics, applies a demo config, runs the worker (router,
deliver, retry), the HTTP ingestion API and a demo receiver, sends one call of every type through
Kafka and one through the ingestion API, and prints them as they arrive, signature checked.
Ctrl-C stops everything.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import time
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from pipeline.commands._args import Subparsers
from pipeline.core.config import validate_config
from pipeline.core.settings import Settings
from pipeline.http.ingest import start_ingest
from pipeline.http.receiver import ReceivedCall, describe, make_receiver_app
from pipeline.kafka.broker import EmbeddedBroker
from pipeline.kafka.clients import create_topics
from pipeline.kafka.cluster import fit_to_cluster, reach
from pipeline.kafka.config_store import apply_config, load_table
from pipeline.ops.send import send_lines
from pipeline.roles.worker import run_roles
from pipeline.runtime import event_loop
from pipeline.runtime.gc_tuning import tune_for_throughput
from pipeline.runtime.net import free_port_or

__all__ = ["run_dev", "DEMO_CALLS", "demo_config"]

DEMO_WRITE_KEY = "demo-write-key"
DEMO_SECRET = "demo-shared-secret"

DEMO_CALLS: list[dict[str, Any]] = [
    {
        "type": "identify",
        "userId": "user-1",
        "traits": {"name": "Ada Lovelace", "plan": "pro", "logins": 12},
    },
    {
        "type": "track",
        "userId": "user-1",
        "event": "Order Completed",
        "properties": {"revenue": "42.50", "currency": "EUR"},
    },
    {
        "type": "page",
        "userId": "user-1",
        "name": "Pricing",
        "properties": {
            "path": "/pricing",
            "referrer": "https://example.com/",
            "title": "Pricing",
            "url": "https://shop.example/pricing",
        },
    },
    {
        "type": "screen",
        "userId": "user-1",
        "name": "Home",
        "context": {
            "device": {"model": "Pixel 9", "type": "android"},
            "os": {"name": "Android", "version": "16"},
            "app": {"build": "412", "name": "Shop", "version": "4.1.2"},
        },
    },
    {
        "type": "group",
        "userId": "user-1",
        "groupId": "acme",
        "traits": {"name": "Acme Inc", "employee count": 250},
    },
    {"type": "alias", "userId": "user-1", "previousId": "anon-7f3a"},
    {
        "type": "track",
        "anonymousId": "anon-9c1d",
        "event": "Débogage ✓",
        "properties": {"note": "non-ASCII travels as is"},
    },
    {"type": "delete", "userId": "user-0"},
]


def demo_config(receiver_url: str) -> dict[str, Any]:
    return {
        "sources": [{"id": "demo", "name": "Demo source", "write_keys": [DEMO_WRITE_KEY]}],
        "destinations": [
            {
                "id": "demo-webhooks",
                "name": "Webhooks",
                "enabled": True,
                "sources": ["demo"],
                "shared_secret": DEMO_SECRET,
                "webhooks": [
                    {"url": f"{receiver_url}/hook", "headers": {"Authorization": "Bearer demo"}}
                ],
            }
        ],
    }


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def _post_through_ingest(url: str) -> None:
    """One call the way a Segment library sends it: HTTP Basic with the write key."""
    call = {"userId": "user-2", "event": "Signed Up", "properties": {"via": "HTTP ingestion API"}}
    async with aiohttp.ClientSession(auth=aiohttp.BasicAuth(DEMO_WRITE_KEY, "")) as session:
        async with session.post(f"{url}/v1/track", json=call) as response:
            if response.status != 200:
                raise RuntimeError(
                    f"the ingestion API answered {response.status}: {await response.text()}"
                )


async def _dev(
    settings: Settings, receiver_port: int, broker_port: int, ingest_port: int, console_port: int
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    broker = EmbeddedBroker(port=broker_port)
    _say(f"▸ starting the embedded Kafka-compatible broker (tansu) on 127.0.0.1:{broker.port}")
    await asyncio.to_thread(broker.start)
    settings = settings.replace(bootstrap_servers=broker.bootstrap_servers)
    runner: web.AppRunner | None = None
    ingest: web.AppRunner | None = None
    console: web.AppRunner | None = None
    worker: asyncio.Task[None] | None = None
    try:
        cluster = await asyncio.to_thread(reach, settings)
        settings = fit_to_cluster(settings, cluster)
        created = await asyncio.to_thread(create_topics, settings)
        _say(f"▸ created {len(created)} topics")

        arrived = 0

        def on_call(call: ReceivedCall) -> None:
            nonlocal arrived
            arrived += 1
            print(f"  ✓ received {describe(call)}", flush=True)

        app = make_receiver_app(secret=DEMO_SECRET, out=None, on_call=on_call)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", receiver_port).start()
        receiver_url = f"http://127.0.0.1:{receiver_port}"
        _say(f"▸ demo receiver on {receiver_url} (verifies X-Signature)")

        config = validate_config(demo_config(receiver_url))
        await asyncio.to_thread(apply_config, settings, config)
        _say("▸ applied the demo config: source 'demo' → destination 'demo-webhooks'")

        roles = ["router", "deliver", "retry"]
        if settings.log:
            # The broker is new, so is its log: a store of an earlier run would skip its offsets.
            await asyncio.to_thread(_fresh_log_store, settings)
            roles.append("log-store")
        ready = asyncio.Event()
        worker = asyncio.create_task(run_roles(settings, roles, stop, ready=ready))
        await _first(ready.wait(), worker)
        _say(f"▸ worker running: {', '.join(roles)} (joining consumer groups takes a few seconds)")

        ingest, ingest_url = await start_ingest(settings, "127.0.0.1", ingest_port)
        _say(
            f"▸ ingestion API on {ingest_url} (Segment-compatible: point any Segment library at it)"
        )

        console, console_note = await _start_console(settings, console_port)
        _say(console_note)

        table = await asyncio.to_thread(load_table, settings)
        lines = [orjson.dumps(call) for call in DEMO_CALLS]
        started = time.monotonic()
        summary = await asyncio.to_thread(
            send_lines, settings, lines, write_key=DEMO_WRITE_KEY, table=table, progress=False
        )
        await _post_through_ingest(ingest_url)
        expected = summary.sent + 1
        _say(
            f"▸ sent {summary.sent} sample calls, one of every type, through Kafka and 1 through "
            "the ingestion API; waiting for them to arrive:"
        )
        while arrived < expected and not stop.is_set() and not worker.done():
            await asyncio.sleep(0.1)
        if arrived >= expected:
            _say(f"▸ all {arrived} arrived in {time.monotonic() - started:.1f} s.")
        _say(
            "\nThe pipeline keeps running. Try:\n"
            f"  curl -u {DEMO_WRITE_KEY}: -H 'Content-Type: application/json' "
            f"""-d '{{"userId":"u9","event":"Hello"}}' {ingest_url}/v1/track\n"""
            f"  pipeline send calls.jsonl --write-key {DEMO_WRITE_KEY} "
            f"--bootstrap-servers {settings.bootstrap_servers}\n"
            + (
                f"  pipeline log --bootstrap-servers {settings.bootstrap_servers}   "
                "(then: pipeline trace MESSAGE_ID, pipeline stats)\n"
                if settings.log
                else ""
            )
            + "Ctrl-C stops everything."
        )
        await _first(stop.wait(), worker)
    finally:
        stop.set()
        _say("\n▸ stopping…")
        if worker is not None:
            with contextlib.suppress(Exception):
                await worker
        if console is not None:
            await console.cleanup()
        if ingest is not None:
            await ingest.cleanup()
        if runner is not None:
            await runner.cleanup()
        # Clients still closing would only report the broker going away.
        logging.getLogger("pipeline.kafka").setLevel(logging.ERROR)
        logging.getLogger("pipeline.rdkafka").setLevel(logging.ERROR)
        await asyncio.to_thread(broker.stop)
        _say("▸ stopped.")


async def _start_console(settings: Settings, port: int) -> tuple[web.AppRunner, str]:
    """The web console on loopback; its password is ``PIPELINE_CONSOLE_PASSWORD`` or made up."""
    from pipeline.commands.console import PASSWORD_ENV, console_password
    from pipeline.http.console import make_console_app

    password, made_up = console_password("127.0.0.1", settings)
    runner = web.AppRunner(make_console_app(settings, password=password), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    shown = (
        f"password {password} (made up; set {PASSWORD_ENV} to choose)"
        if made_up
        else (f"password from {PASSWORD_ENV}")
    )
    return runner, f"▸ web console on http://127.0.0.1:{port} ({shown})"


def _fresh_log_store(settings: Settings) -> None:
    from pipeline.roles.log_store import empty_store

    _say(f"▸ delivery log store: {empty_store(settings)} (emptied: the broker is new)")


async def _first(awaitable: Any, worker: asyncio.Task[None]) -> None:
    waiter = asyncio.ensure_future(awaitable)
    await asyncio.wait([waiter, worker], return_when=asyncio.FIRST_COMPLETED)
    if worker.done() and worker.exception() is not None:
        waiter.cancel()
        raise worker.exception()  # type: ignore[misc]
    waiter.cancel()


def register(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "dev", parents=[common], help="run everything locally on the embedded broker"
    )
    parser.add_argument("--receiver-port", type=int, default=8090)
    parser.add_argument("--broker-port", type=int, default=9092)
    parser.add_argument("--ingest-port", type=int, default=8080)
    parser.add_argument("--console-port", type=int, default=8070)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    run_dev(
        settings,
        receiver_port=args.receiver_port,
        broker_port=args.broker_port,
        ingest_port=args.ingest_port,
        console_port=args.console_port,
    )
    return 0


def run_dev(
    settings: Settings,
    *,
    receiver_port: int = 8090,
    broker_port: int = 9092,
    ingest_port: int = 8080,
    console_port: int = 8070,
) -> None:
    settings = settings.replace(
        # The demo receiver is on loopback, which the SSRF guard blocks by default.
        allowed_networks=(*settings.allowed_networks, "127.0.0.0/8"),
    )
    tune_for_throughput()
    event_loop.run(
        _dev(
            settings,
            free_port_or(receiver_port),
            free_port_or(broker_port),
            free_port_or(ingest_port),
            free_port_or(console_port),
        ),
        settings.event_loop,
    )
