"""Ingestion API throughput, and the client library's cost per call against segment-analytics-python.

    .venv/bin/python -m bench.ingest_client
    .venv/bin/python -m bench.ingest_client --requests 3000 --concurrency 32 --calls 20000

Starts its own embedded broker and one ``pipeline ingest`` process on 127.0.0.1, then:

1. API: ``--requests`` POSTs of ``/v1/batch`` with ``--batch`` calls each, ``--concurrency`` in
   flight (aiohttp client in this process); calls/s = calls acknowledged / wall time. Every answer
   must be 200: each one means Kafka acknowledged the calls.
2. Clients, the same loop for both: ``--calls`` ``track()`` calls as fast as possible, with each
   library's defaults, pointed at the same API. Reports µs per ``track()`` (the caller's cost),
   then flushes and reports how many calls were lost (dropped on a full queue, or failed).
   Every client starts cold, as a short script's would; the last row warms the Kafka transport
   with one delivered call first (an idempotent producer's first send waits ~0.5 s for its
   producer id on the embedded broker, and the queue fills meanwhile).

Bounded: every wait has a timeout. The numbers depend on the machine: the broker, the API and
the load generator share its CPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import httpx
import orjson

from pipeline.client import Client
from pipeline.core.config import validate_config
from pipeline.core.settings import Settings
from pipeline.kafka.broker import EmbeddedBroker
from pipeline.kafka.clients import create_topics
from pipeline.kafka.config_store import apply_config
from pipeline.runtime.net import free_port

WRITE_KEY = "wk_bench"


def _wait_ready(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the ingestion API at {url} was not ready within {timeout:.0f} s")


async def _api_throughput(url: str, requests: int, batch: int, concurrency: int) -> dict[str, Any]:
    import aiohttp

    bodies = [
        orjson.dumps(
            {
                "batch": [
                    {
                        "type": "track",
                        "userId": f"u{(r * batch + i) % 5000}",
                        "event": "Order Completed",
                        "properties": {"revenue": "42.50", "currency": "EUR", "n": i},
                    }
                    for i in range(batch)
                ]
            }
        )
        for r in range(requests)
    ]
    statuses: dict[int, int] = {}
    queue = iter(bodies)
    headers = {
        "Authorization": "Basic " + base64.b64encode(f"{WRITE_KEY}:".encode()).decode(),
        "Content-Type": "application/json",
    }
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:

        async def worker() -> None:
            for body in queue:
                async with session.post(url + "/v1/batch", data=body) as response:
                    await response.read()
                    statuses[response.status] = statuses.get(response.status, 0) + 1

        # Warm up: connections, the producer's metadata.
        async with session.post(url + "/v1/batch", data=bodies[0]) as response:
            assert response.status == 200, await response.text()
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    acknowledged = statuses.get(200, 0) * batch
    return {
        "requests": requests,
        "batch": batch,
        "concurrency": concurrency,
        "seconds": elapsed,
        "calls_per_s": acknowledged / elapsed,
        "requests_per_s": requests / elapsed,
        "statuses": statuses,
    }


def _loop(client: Any, calls: int) -> float:
    """The same tight loop for every library; µs per track() call."""
    properties = {"revenue": "42.50", "currency": "EUR"}
    started = time.perf_counter()
    for i in range(calls):
        client.track(user_id=f"u{i % 5000}", event="Order Completed", properties=properties)
    return (time.perf_counter() - started) / calls * 1e6


def _ours(url: str, calls: int, *, warm: bool = False, **kwargs: Any) -> dict[str, Any]:
    client = Client(WRITE_KEY, endpoint=url, **kwargs)
    if warm:  # one call delivered first: connections and producer id are in place
        client.track(user_id="warm-up", event="Warm Up")
        client.flush(timeout=30)
        client.sent = 0
    us = _loop(client, calls)
    started = time.perf_counter()
    delivered_all = client.flush(timeout=120)
    drain = time.perf_counter() - started
    client.close(timeout=10)
    return {
        "us_per_call": us,
        "lost": client.dropped + client.failed,
        "sent": client.sent,
        "flush_seconds": drain,
        "flush_ok": delivered_all,
    }


def _queue_only(url: str, calls: int) -> tuple[float, float]:
    """µs per track() with nothing being delivered meanwhile: ours with no flush due, Segment's
    with ``send=False`` (it validates and measures each call, and queues nothing)."""
    from segment.analytics import Client as SegmentClient

    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens: the calls are thrown away
    ours = Client(
        WRITE_KEY,
        endpoint=nowhere,
        flush_at=calls + 1,
        flush_after=3600,
        max_queue_size=calls + 1,
        max_retries=0,
    )
    ours_us = _loop(ours, calls)
    ours.close(timeout=0.5)
    segment = SegmentClient(WRITE_KEY, host=url, send=False)
    return ours_us, _loop(segment, calls)


def _segment(url: str, calls: int) -> dict[str, Any]:
    from segment.analytics import Client as SegmentClient

    failed = 0

    def on_error(_error: Exception, batch: list[Any]) -> None:
        nonlocal failed
        failed += len(batch)

    client = SegmentClient(WRITE_KEY, host=url, on_error=on_error)
    properties = {"revenue": "42.50", "currency": "EUR"}
    dropped = 0
    started = time.perf_counter()
    for i in range(calls):
        ok, _ = client.track(user_id=f"u{i % 5000}", event="Order Completed", properties=properties)
        dropped += not ok
    us = (time.perf_counter() - started) / calls * 1e6
    started = time.perf_counter()
    client.flush()
    drain = time.perf_counter() - started
    client.join()
    return {"us_per_call": us, "lost": dropped + failed, "flush_seconds": drain}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="API: batch requests")
    parser.add_argument("--batch", type=int, default=100, help="API: calls per request")
    parser.add_argument("--concurrency", type=int, default=32, help="API: requests in flight")
    parser.add_argument("--calls", type=int, default=20000, help="clients: track() calls")
    args = parser.parse_args()

    with EmbeddedBroker(port=0) as broker:
        settings = Settings(
            bootstrap_servers=broker.bootstrap_servers,
            topic_prefix=f"bench{uuid.uuid4().hex[:6]}.",
        )
        create_topics(settings)
        config = {"sources": [{"id": "web", "write_keys": [WRITE_KEY]}]}
        apply_config(settings, validate_config(config))
        port = free_port()
        env = dict(
            os.environ,
            PIPELINE_BOOTSTRAP_SERVERS=settings.bootstrap_servers,
            PIPELINE_TOPIC_PREFIX=settings.topic_prefix,
        )
        api = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "ingest", "--port", str(port)],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(url)
            result = asyncio.run(_api_throughput(url, args.requests, args.batch, args.concurrency))
            print(
                f"ingestion API, one process: {result['calls_per_s']:,.0f} calls/s "
                f"({result['requests_per_s']:,.0f} requests/s of {args.batch} calls, "
                f"{args.concurrency} in flight, {args.requests} requests in "
                f"{result['seconds']:.2f} s, statuses {result['statuses']})"
            )
            ours = _ours(url, args.calls)
            segment = _segment(url, args.calls)
            direct = {
                "bootstrap_servers": settings.bootstrap_servers,
                "topic_prefix": settings.topic_prefix,
                "source_id": "web",
            }
            kafka = _ours(url, args.calls, **direct)
            kafka_warm = _ours(url, args.calls, warm=True, **direct)
            queue_ours, queue_segment = _queue_only(url, args.calls)
            print(f"\n{args.calls:,} track() calls in a tight loop, library defaults:")
            print(f"{'client':<42} {'µs/call':>8} {'lost':>6} {'flush s':>8}")
            for name, row in (
                ("pipeline.client (HTTP to the API)", ours),
                ("segment-analytics-python 2.x (same API)", segment),
                ("pipeline.client (Kafka transport)", kafka),
                ("pipeline.client (Kafka, after one call)", kafka_warm),
            ):
                print(
                    f"{name:<42} {row['us_per_call']:>8.1f} {row['lost']:>6} "
                    f"{row['flush_seconds']:>8.2f}"
                )
            print(
                f"with nothing delivered meanwhile: pipeline.client {queue_ours:.1f} µs/call, "
                f"segment-analytics-python (send=False) {queue_segment:.1f} µs/call"
            )
        finally:
            api.terminate()
            try:
                api.wait(15)
            except subprocess.TimeoutExpired:
                api.kill()
                api.wait()


if __name__ == "__main__":
    main()
