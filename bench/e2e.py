"""End-to-end throughput: produce → router → deliver → a local receiver, one worker process.

    .venv/bin/python -m bench.e2e --calls 20000

Starts its own embedded broker and an aiohttp receiver on 127.0.0.1, produces the calls first
(a backlog), then starts one worker process (router + deliver + retry) and times until the
receiver has every call. Bounded: at most ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid

import orjson
from pipeline._broker import EmbeddedBroker
from pipeline._config import validate_config
from pipeline._config_store import apply_config
from pipeline._kafka import create_topics
from pipeline._send import send_lines
from pipeline._settings import Settings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()

    with EmbeddedBroker(port=0) as broker:
        settings = Settings(
            bootstrap_servers=broker.bootstrap_servers,
            topic_prefix=f"bench{uuid.uuid4().hex[:6]}.",
            session_timeout=6.0,
        )
        create_topics(settings)
        # The receiver runs in a separate process so it does not share this one's GIL.
        receiver = subprocess.Popen(
            [sys.executable, "-c", RECEIVER_CODE], stdout=subprocess.PIPE, text=True
        )
        assert receiver.stdout is not None
        port = int(receiver.stdout.readline())
        config = {
            "sources": [{"id": "web", "write_keys": ["wk"]}],
            "destinations": [
                {"id": "d", "sources": ["web"], "webhooks": [{"url": f"http://127.0.0.1:{port}/h"}]}
            ],
        }
        apply_config(settings, validate_config(config))
        body = {"type": "track", "event": "Bench", "properties": {"plan": "pro", "n": 1, "text": "x" * 300}}
        lines = (orjson.dumps(dict(body, userId=f"u{i % 1000}")) for i in range(args.calls))
        summary = send_lines(settings, lines, write_key="wk", progress=False)
        assert summary.sent == args.calls

        env = dict(os.environ, PIPELINE_BOOTSTRAP_SERVERS=settings.bootstrap_servers,
                   PIPELINE_TOPIC_PREFIX=settings.topic_prefix, PIPELINE_SESSION_TIMEOUT="6s",
                   PIPELINE_ALLOWED_NETWORKS="127.0.0.0/8")
        started = time.monotonic()
        worker = subprocess.Popen([sys.executable, "-m", "pipeline", "worker"], env=env,
                                  stderr=subprocess.DEVNULL)
        first = None
        try:
            deadline = started + args.timeout
            count = 0
            while time.monotonic() < deadline:
                count = int(_ask(port))
                if count and first is None:
                    first = time.monotonic()
                if count >= args.calls:
                    break
                time.sleep(0.05)
            end = time.monotonic()
        finally:
            worker.terminate()
            worker.wait(30)
            receiver.kill()
            receiver.wait()
    assert first is not None
    rate = count / (end - first)
    print(f"calls={args.calls} delivered={count} first-after={first - started:.1f}s "
          f"rate={rate:,.0f} events/s (from first delivery to last)")


def _ask(port: int) -> str:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", "/count")
    return connection.getresponse().read().decode()


RECEIVER_CODE = r"""
import asyncio
from aiohttp import web
count = 0
async def post(request):
    global count
    await request.read()
    count += 1
    return web.Response(text="ok")
async def get(request):
    return web.Response(text=str(count))
async def main():
    app = web.Application()
    app.router.add_post("/{tail:.*}", post)
    app.router.add_get("/count", get)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=2048)
    await site.start()
    print(runner.addresses[0][1], flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""

if __name__ == "__main__":
    main()
