"""``AsyncClient``: the same client for asyncio applications, without a thread.

The call methods are plain functions, as in ``Client``: queuing never waits, so there is nothing
to await (Segment's Node library does the same). Delivery runs in a task on the running loop,
with ``httpx.AsyncClient`` or ``pipeline``'s ``AsyncProducer``; ``await flush()`` and
``await close()`` never block the loop. Use it from the loop's thread only, and close it before
the loop ends (``async with AsyncClient(...) as client:``): an ended loop cannot deliver at exit.

    async with AsyncClient("wk_live_1") as client:
        client.track(user_id="u1", event="Signed Up")
        await client.flush(timeout=5)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from . import _metrics as client_metrics
from ._batches import split_batches
from ._errors import ClientClosed, DeliveryError, QueueFull
from ._log import DropWarnings, debug_requested, enable_debug_logging, log
from ._messages import UNRESOLVED_SOURCE, Queued, prepare
from ._methods import CallMethods, OnError
from ._options import DEFAULT_ENDPOINT, DEFAULT_FLUSH_AT, DEFAULT_MAX_QUEUE_SIZE, ClientOptions
from ._transports import AsyncHttpTransport, AsyncKafkaTransport, AsyncTransport

__all__ = ["AsyncClient"]


class AsyncClient(CallMethods):
    """``Client`` for asyncio: same arguments, same counters, ``await flush()``/``close()``."""

    def __init__(
        self,
        write_key: str,
        endpoint: str = DEFAULT_ENDPOINT,
        flush_at: int = DEFAULT_FLUSH_AT,
        flush_after: float = 5.0,
        max_queue_size: int = DEFAULT_MAX_QUEUE_SIZE,
        on_error: OnError | None = None,
        bootstrap_servers: str | None = None,
        gzip: bool = True,
        max_retries: int = 10,
        timeout: float = 10.0,
        *,
        size: int | None = None,
        source_id: str | None = None,
        topic_prefix: str = "",
        kafka_config: Mapping[str, Any] | None = None,
        schema_registry_url: str | None = None,
        debug: bool | None = None,
        transport: AsyncTransport | None = None,
    ) -> None:
        self.options = ClientOptions.build(
            write_key,
            size=size,
            endpoint=endpoint,
            flush_at=flush_at,
            flush_after=flush_after,
            max_queue_size=max_queue_size,
            gzip=gzip,
            max_retries=max_retries,
            timeout=timeout,
            bootstrap_servers=bootstrap_servers,
            source_id=source_id,
            topic_prefix=topic_prefix,
            kafka_config=dict(kafka_config or {}),
            schema_registry_url=schema_registry_url,
        )
        self.on_error = on_error
        if debug or (debug is None and debug_requested()):
            enable_debug_logging()
        self._source_id = source_id or UNRESOLVED_SOURCE
        self._keep_call = self.options.transport == "kafka"  # the HTTP transport sends bytes
        self._own_transport = transport is None
        self._transport: AsyncTransport | None = transport
        if transport is None and self.options.transport == "kafka":
            self._transport = self._make_transport()  # connects while the first calls queue
        self._queue: deque[Queued] = deque()
        self._accepted = 0
        self._finished = 0
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()
        self._flush_requested = False
        self._stopping = False
        self._abandon = False
        self._closed = False
        self._drop_warnings = DropWarnings()
        self._last_flush = time.monotonic()
        self._oldest: float | None = None
        self._task: asyncio.Task[None] | None = None
        self.sent = 0
        self.dropped = 0
        client_metrics.register(self)
        self.failed = 0
        self.batches = 0

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def flush_at(self) -> int:
        return self.options.flush_at

    @property
    def flush_after(self) -> float:
        return self.options.flush_after

    def _enqueue(self, message: dict[str, Any], now: int) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "AsyncClient calls must be made from a coroutine on its event loop; "
                "use Client from threads and synchronous code"
            ) from None
        item = prepare(
            message, event_time=now, source_id=self._source_id, keep_call=self._keep_call
        )
        if self._closed or len(self._queue) >= self.options.max_queue_size:
            self.dropped += 1
            client_metrics.DROPPED.labels("closed" if self._closed else "queue_full").inc()
            error: Exception = (
                ClientClosed("the client is closed; the call was dropped")
                if self._closed
                else QueueFull(self.options.max_queue_size)
            )
            self._drop_warnings.dropped(error)
            self._report(error, [item])
            return
        self._queue.append(item)
        self._accepted += 1
        waiting = len(self._queue)
        if waiting == 1:
            self._oldest = time.monotonic()
        if waiting == 1 or waiting == self.options.flush_at:
            self._ensure_task()
            self._wake.set()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("queued %s %s (%d waiting)", message["type"], message["messageId"], waiting)

    def _ensure_task(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            items = await self._next_batch()
            if items is None:
                return
            if self._transport is None:
                self._transport = self._make_transport()
            for batch in split_batches(items):
                await self._send_with_retries(self._transport, batch)

    async def _next_batch(self) -> list[Queued] | None:
        options = self.options
        while True:
            if self._abandon:
                return None
            self._wake.clear()
            waiting = len(self._queue)
            if not waiting:
                self._flush_requested = False
                if self._stopping:
                    return None
                await self._wake.wait()
                continue
            now = time.monotonic()
            due = max(self._last_flush, self._oldest or now) + options.flush_after
            if waiting >= options.flush_at or self._flush_requested or self._stopping or now >= due:
                items = list(self._queue)
                self._queue.clear()
                self._flush_requested = False
                self._last_flush = now
                self._oldest = None
                return items
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), due - now)

    def _make_transport(self) -> AsyncTransport:
        o = self.options
        if o.transport == "kafka":
            assert o.bootstrap_servers is not None and o.source_id is not None
            return AsyncKafkaTransport(
                o.bootstrap_servers,
                o.source_id,
                topic_prefix=o.topic_prefix,
                timeout=o.timeout,
                config=o.kafka_config,
                schema_registry_url=o.schema_registry_url,
            )
        return AsyncHttpTransport(o.write_key, o.endpoint, gzip=o.gzip, timeout=o.timeout)

    async def _send_with_retries(self, transport: AsyncTransport, batch: list[Queued]) -> None:
        pending: Sequence[Queued] = batch
        attempt = 0
        while True:
            if self._abandon:
                self._finish(pending, failed=ClientClosed("closed before these calls were sent"))
                return
            try:
                await transport.send(pending)
            except DeliveryError as exc:
                error = exc
            except Exception as exc:
                log.exception("sending a batch failed")
                error = DeliveryError(f"{type(exc).__name__}: {exc}", retryable=True)
            else:
                log.debug("delivered %d calls", len(pending))
                self._finish(pending, batch=True)
                return
            if error.pending is not None:
                left = {id(item) for item in error.pending}
                self._finish([item for item in pending if id(item) not in left])
                pending = list(error.pending)
            if not error.retryable or attempt >= self.options.max_retries:
                log.error(
                    "giving up on %d calls after %d tries: %s", len(pending), attempt + 1, error
                )
                self._finish(pending, failed=error)
                return
            delay = self.options.backoff.delay(attempt, error.retry_after)
            attempt += 1
            log.debug("retry %d of %d calls in %.2f s: %s", attempt, len(pending), delay, error)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._abandoned(), delay)

    async def _abandoned(self) -> None:
        while not self._abandon:
            await self._wake.wait()
            self._wake.clear()

    def _finish(
        self, items: Sequence[Queued], *, failed: Exception | None = None, batch: bool = False
    ) -> None:
        self._finished += len(items)
        if failed is None:
            self.sent += len(items)
            self.batches += batch
        else:
            self.failed += len(items)
            client_metrics.FAILED.inc(len(items))
            if items:
                self._report(failed, items)
        self._progress.set()

    async def _wait_finished(self, target: int) -> None:
        while self._finished < target:
            self._progress.clear()
            if self._task is None or self._task.done():
                self._ensure_task()
            await self._progress.wait()

    async def flush(self, timeout: float | None = None) -> bool:
        """Deliver everything queued so far; ``True`` if all was delivered within ``timeout``."""
        target = self._accepted
        failed_before = self.failed
        if self._finished < target:
            self._flush_requested = True
            self._ensure_task()
            self._wake.set()
            try:
                await asyncio.wait_for(self._wait_finished(target), timeout)
            except TimeoutError:
                return False
        return self.failed == failed_before

    async def close(self, timeout: float | None = None) -> bool:
        """Deliver everything queued (within ``timeout``), then stop; later calls are dropped."""
        if self._closed and self._task is None:
            return not self._queue
        self._closed = True
        ok = await self.flush(timeout)
        self._stopping = True
        self._abandon = not ok
        self._wake.set()
        task, self._task = self._task, None
        if task is not None:
            try:
                await asyncio.wait_for(task, 5.0)
            except TimeoutError:
                log.warning("the delivery task did not stop in time")
        leftover = list(self._queue)
        self._queue.clear()
        if leftover:
            self._finish(leftover, failed=ClientClosed(f"closed with {len(leftover)} calls queued"))
        if self._transport is not None and self._own_transport:
            await self._transport.aclose()
            self._transport = None
        return ok

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()
