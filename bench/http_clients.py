"""The cost of one webhook request with each candidate async HTTP client, on this machine.

    .venv/bin/python -m bench.http_clients                          # 20,000 requests, 3 runs
    .venv/bin/python -m bench.http_clients --requests 5000 --runs 5
    .venv/bin/python -m bench.http_clients --clients aiohttp/asyncio,pyreqwest/uvloop

Starts one ``bench._receiver`` process on 127.0.0.1 (answers 200 ``ok`` at once) and, in this
process, POSTs ``--requests`` webhook bodies (~300 bytes of JSON, the headers the pipeline sends:
Content-Type, User-Agent, X-Signature and the Standard Webhooks trio) to it with ``--concurrency``
(100) in flight to the one host, reading each answer's status and at most 1 KiB of its body, with
each client in turn: aiohttp (configured as ``pipeline.http.sender`` configures it), pyreqwest
(reqwest/hyper/tokio in Rust) and the pipeline's own HTTP/1.1 client (``pipeline.http.h1_post``,
httptools parsing), each on the default asyncio loop and on uvloop; rnet (also Rust)
too when it can be imported (it is no dependency of ours: ``pip install --target /tmp/extra rnet``
and ``PYTHONPATH=/tmp/extra``). Each client opens its connections first (a warm-up of 1,000
requests, not measured), as a running worker has them.

Reported per client: requests/s (wall clock of the measured requests), this process's CPU time
per request (``getrusage(RUSAGE_SELF)``, user + system, every thread: the Rust clients' own
runtime threads count) and the event loop thread's alone (``time.thread_time``: the part that
holds the GIL, which bounds one worker process), each the median over ``--runs`` runs, and each
ratio against aiohttp on asyncio measured in the same run (clients back to back, their order
rotated each run), the median of the per-run ratios. This machine is shared and noisy: the
ratios are the figures to read, not the absolute ones. The receiver's CPU share (% of one core) is
shown too: near 100 %, requests/s is the receiver's limit and only the CPU per request compares
the clients.

Every wait is bounded; the receiver is ended by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import ssl
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
import orjson

from pipeline.core.address_policy import AddressPolicy
from pipeline.core.signing import SIGNATURE_HEADER, sign, standard_webhooks_headers
from pipeline.http.address_guard import GuardedResolver
from pipeline.http.h1_post import H1Poster
from pipeline.http.sender import USER_AGENT

from ._harness import Receiver

__all__ = ["CLIENTS", "main"]

#: How much of each answer's body is read (the pipeline keeps a snippet of it).
BODY_CAP = 1024
#: Each request's total timeout (seconds), as ``PIPELINE_DELIVERY_TIMEOUT`` sets the sender's.
REQUEST_TIMEOUT = 10.0
#: Requests sent before the measured ones, through the same client (connections opened).
WARM_UP = 1_000
#: The shared secret the body is signed with.
SECRET = "bench-s3cret"

#: One request: POST the body, read the status and at most ``BODY_CAP`` bytes; the status.
Post = Callable[[], Awaitable[int]]
#: A client made for one phase: ``(url, body, headers)`` → a context yielding its ``Post``.
OpenClient = Callable[[str, bytes, dict[str, str]], AbstractAsyncContextManager[Post]]
T = TypeVar("T")


def webhook_request() -> tuple[bytes, dict[str, str]]:
    """A ~300-byte JSON body and the headers the pipeline would send with it."""
    body = orjson.dumps(
        {
            "type": "track",
            "event": "Order Completed",
            "messageId": "6f1c4e0a-8d1b-4b8e-9a57-2d0c5e7f3a91",
            "userId": "user-0042",
            "timestamp": "2025-01-01T12:00:00.000Z",
            "properties": {"plan": "pro", "revenue": 42.5, "currency": "EUR", "items": 3},
            "context": {"ip": "203.0.113.9", "library": {"name": "bench", "version": "1.0"}},
            "sentAt": "2025-01-01T12:00:00.120Z",
        }
    )
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        SIGNATURE_HEADER: sign(body, SECRET),
        **standard_webhooks_headers("msg_6f1c4e0a8d1b", int(time.time()), body, SECRET),
    }
    return body, headers


# ---- the clients ----------------------------------------------------------------------------


@asynccontextmanager
async def aiohttp_client(url: str, body: bytes, headers: dict[str, str]) -> AsyncIterator[Post]:
    """aiohttp as ``WebhookSender.start`` sets it up (no pool limit: the sender's own per-host
    slots limit it; no decompression, no cookies, no redirects)."""
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=60)
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
        auto_decompress=False,
        skip_auto_headers=("Accept-Encoding",),
        cookie_jar=aiohttp.DummyCookieJar(),
    ) as session:

        async def post() -> int:
            async with session.post(
                url, data=body, headers=headers, allow_redirects=False
            ) as response:
                await response.content.read(BODY_CAP)
                return response.status

        yield post


@asynccontextmanager
async def pyreqwest_client(url: str, body: bytes, headers: dict[str, str]) -> AsyncIterator[Post]:
    """pyreqwest: no redirects, a total timeout, no decompression; the answer streamed so that
    at most ``BODY_CAP`` bytes of it are read (``build()`` would read the whole body)."""
    from pyreqwest.client import ClientBuilder

    builder = (
        ClientBuilder()
        .follow_redirects(False)
        .timeout(timedelta(seconds=REQUEST_TIMEOUT))
        .gzip(False)
        .brotli(False)
        .zstd(False)
        .deflate(False)
    )
    async with builder.build() as client:

        async def post() -> int:
            request = client.post(url).headers(headers).body_bytes(body).build_streamed()
            async with request as response:
                await response.body_reader.read(BODY_CAP)
                return response.status

        yield post


@asynccontextmanager
async def httptools_client(url: str, body: bytes, headers: dict[str, str]) -> AsyncIterator[Post]:
    """The pipeline's own client (``PIPELINE_HTTP_CLIENT=httptools``), as the sender sets it up:
    HTTP/1.1 on the event loop's connections, kept alive, at most ``BODY_CAP`` of an answer read
    (its result's status, snippet and ``Retry-After`` made as for a delivery)."""
    policy = AddressPolicy.parse(("127.0.0.0/8",))
    poster = H1Poster(
        GuardedResolver(policy),
        REQUEST_TIMEOUT,
        max_bytes=BODY_CAP,
        ssl_context=ssl.create_default_context(),
    )
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80

    async def post() -> int:
        return (await poster.post(url, host, port, headers, body)).status or 0

    try:
        yield post
    finally:
        await poster.aclose()


@asynccontextmanager
async def rnet_client(url: str, body: bytes, headers: dict[str, str]) -> AsyncIterator[Post]:
    """rnet (wreq/tokio in Rust): no redirects, a total timeout, no decompression; the answer
    streamed, read until ``BODY_CAP`` bytes or its end."""
    import rnet  # type: ignore[import-not-found, unused-ignore]  # optional: not a dependency

    client = rnet.Client(
        allow_redirects=False,
        timeout=int(REQUEST_TIMEOUT),
        gzip=False,
        brotli=False,
        deflate=False,
        zstd=False,
    )

    async def post() -> int:
        response = await client.post(url, body=body, headers=headers)
        async with response:
            read = 0
            async with response.stream() as chunks:
                async for chunk in chunks:
                    read += len(chunk)
                    if read >= BODY_CAP:
                        break
            return int(response.status)

    yield post


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class Client:
    """A client under test: its name in the report, how to make it, the loop it runs on."""

    name: str
    open: OpenClient
    loop: str  # "asyncio" or "uvloop"


def _clients() -> list[Client]:
    every = [
        Client("aiohttp/asyncio", aiohttp_client, "asyncio"),
        Client("aiohttp/uvloop", aiohttp_client, "uvloop"),
        Client("pyreqwest/asyncio", pyreqwest_client, "asyncio"),
        Client("pyreqwest/uvloop", pyreqwest_client, "uvloop"),
        Client("httptools/asyncio", httptools_client, "asyncio"),
        Client("httptools/uvloop", httptools_client, "uvloop"),
        Client("rnet/asyncio", rnet_client, "asyncio"),
        Client("rnet/uvloop", rnet_client, "uvloop"),
    ]
    needs = {"pyreqwest": "pyreqwest", "rnet": "rnet"}
    usable = []
    for client in every:
        library = client.name.split("/")[0]
        if library in needs and not _importable(needs[library]):
            continue
        if client.loop == "uvloop" and not _importable("uvloop"):
            continue
        usable.append(client)
    return usable


#: The clients this machine can run (the reference, aiohttp on asyncio, first).
CLIENTS = _clients()
REFERENCE = CLIENTS[0].name


# ---- one phase: one client, one run ---------------------------------------------------------


@dataclass(frozen=True)
class Figures:
    rate: float  # requests/s
    cpu_us: float  # this process's CPU µs per request (every thread)
    loop_us: float  # the event loop thread's CPU µs per request (the GIL-bound part)
    receiver_share: float  # the receiver's CPU, % of one core, over the same span


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _process_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of another process so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _send(post: Post, count: int, concurrency: int) -> int:
    """``count`` requests, ``concurrency`` in flight; how many were answered 200."""
    left = iter(range(count))

    async def worker() -> int:
        ok = 0
        for _ in left:
            if await post() == 200:
                ok += 1
        return ok

    return sum(await asyncio.gather(*(worker() for _ in range(concurrency))))


async def _phase(
    client: Client, url: str, receiver_pid: int, count: int, concurrency: int, limit: float
) -> Figures:
    body, headers = webhook_request()
    async with asyncio.timeout(limit), client.open(url, body, headers) as post:
        if await _send(post, WARM_UP, concurrency) != WARM_UP:
            raise RuntimeError(f"{client.name}: warm-up requests not all answered 200")
        gc.collect()
        receiver_before = _process_cpu_seconds(receiver_pid)
        cpu_before, loop_before = _cpu_seconds(), time.thread_time()
        started = time.perf_counter()
        ok = await _send(post, count, concurrency)
        wall = time.perf_counter() - started
        cpu, loop_cpu = _cpu_seconds() - cpu_before, time.thread_time() - loop_before
        receiver_cpu = _process_cpu_seconds(receiver_pid) - receiver_before
    if ok != count:
        raise RuntimeError(f"{client.name}: {ok:,} of {count:,} requests answered 200")
    return Figures(
        count / wall, cpu / count * 1e6, loop_cpu / count * 1e6, 100 * receiver_cpu / wall
    )


def _run_on(loop: str, coroutine: Coroutine[Any, Any, T]) -> T:
    if loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coroutine)
    return asyncio.run(coroutine)


def measure(
    client: Client, receiver: Receiver, count: int, concurrency: int, limit: float
) -> Figures:
    """One client's figures for one run, checked against the receiver's count of answers."""
    receiver.reset()
    figures = _run_on(
        client.loop,
        _phase(client, receiver.url(), receiver.process.pid, count, concurrency, limit),
    )
    answered = receiver.stats()["answered"]
    if answered != WARM_UP + count:
        expected = WARM_UP + count
        raise RuntimeError(f"{client.name}: the receiver answered {answered:,}, not {expected:,}")
    return figures


# ---- the report -----------------------------------------------------------------------------


def _rotated(items: list[T], by: int) -> Iterator[T]:
    by %= len(items)
    yield from items[by:] + items[:by]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(
    runs: list[dict[str, Figures]], clients: list[Client], count: int, concurrency: int
) -> str:
    """A Markdown table: medians over runs, ratios against ``REFERENCE`` in the same run."""
    lines = [
        f"{count:,} POSTs of a {len(webhook_request()[0])}-byte body, {concurrency} in flight to "
        f"one host, {len(runs)} runs (medians; ratios against {REFERENCE} taken within each run)",
        "",
        "| client | requests/s | CPU µs/request | loop thread µs/request "
        "| req/s ÷ ref | CPU ÷ ref | loop thread ÷ ref | receiver CPU % |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for client in clients:
        mine = [run[client.name] for run in runs if client.name in run]
        pairs = [
            (run[client.name], run[REFERENCE])
            for run in runs
            if client.name in run and REFERENCE in run
        ]
        lines.append(
            f"| {client.name} "
            f"| {_median([f.rate for f in mine]):,.0f} "
            f"| {_median([f.cpu_us for f in mine]):.1f} "
            f"| {_median([f.loop_us for f in mine]):.1f} "
            f"| {_median([a.rate / b.rate for a, b in pairs]):.2f}× "
            f"| {_median([a.cpu_us / b.cpu_us for a, b in pairs]):.2f}× "
            f"| {_median([a.loop_us / b.loop_us for a, b in pairs]):.2f}× "
            f"| {_median([f.receiver_share for f in mine]):.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000, help="measured POSTs per client")
    parser.add_argument("--runs", type=int, default=3, help="runs (clients alternate in each)")
    parser.add_argument("--concurrency", type=int, default=100, help="requests in flight")
    parser.add_argument(
        "--clients",
        default="",
        help=f"comma-separated subset of: {', '.join(c.name for c in CLIENTS)} (default: all)",
    )
    args = parser.parse_args(argv)
    chosen = [c for c in CLIENTS if not args.clients or c.name in args.clients.split(",")]
    if not chosen or chosen[0].name != REFERENCE:
        chosen = [CLIENTS[0], *(c for c in chosen if c.name != REFERENCE)]
    # A bound on each phase: 300 requests/s would be very slow here (aiohttp sends thousands).
    limit = 30 + (WARM_UP + args.requests) / 300
    receiver = Receiver()
    runs: list[dict[str, Figures]] = []
    try:
        for run in range(args.runs):
            figures: dict[str, Figures] = {}
            for client in _rotated(chosen, run):
                try:
                    figures[client.name] = measure(
                        client, receiver, args.requests, args.concurrency, limit
                    )
                except Exception as exc:  # one client failing leaves the others' figures
                    print(f"run {run + 1}: {client.name} failed: {exc!r}", file=sys.stderr)
                    continue
                f = figures[client.name]
                print(
                    f"run {run + 1}: {client.name:18} {f.rate:9,.0f} req/s "
                    f"{f.cpu_us:7.1f} CPU µs/req ({f.loop_us:6.1f} on the loop thread)  "
                    f"receiver {f.receiver_share:3.0f} %",
                    file=sys.stderr,
                    flush=True,
                )
            runs.append(figures)
    finally:
        receiver.stop()
    print(report(runs, chosen, args.requests, args.concurrency))


if __name__ == "__main__":
    main()
