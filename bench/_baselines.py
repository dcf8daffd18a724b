"""Reference figures measured in the same run as ours: raw aiohttp POSTs and a Kafka topic reader."""

from __future__ import annotations

import asyncio

import aiohttp

from ._harness import Receiver, rate, wait_answered


async def _post_all(
    receiver: Receiver, body: bytes, headers: dict[str, str], count: int, concurrency: int
) -> None:
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        url = receiver.url()

        async def post() -> None:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()

        # Warm-up: open the connections first, as a running worker has them.
        await asyncio.gather(*(post() for _ in range(concurrency)))
        receiver.reset()
        left = iter(range(count))

        async def worker() -> None:
            for _ in left:
                await post()

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def raw_post_rate(
    receiver: Receiver, body: bytes, headers: dict[str, str], count: int, concurrency: int
) -> float:
    """Requests/s of a bare aiohttp loop POSTing ``body`` with ``concurrency`` in flight."""
    asyncio.run(_post_all(receiver, body, headers, count, concurrency))
    return rate(wait_answered(receiver, count, timeout=60))
