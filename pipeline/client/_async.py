"""``AsyncClient``: the same client for asyncio applications, without a thread.

The call methods are plain functions, as in ``Client``: queuing never waits, so there is nothing
to await (Segment's Node library does the same). Delivery runs in a task on the running loop,
with ``httpx.AsyncClient`` or ``pipeline``'s ``AsyncProducer``; ``await flush()`` and
``await close()`` never block the loop. Use it from the loop's thread only, and close it before
the loop ends (``async with AsyncClient(...) as client:``): an ended loop cannot deliver at exit.

    async with AsyncClient("wk_live_1") as client:
        client.track(user_id="u1", event="Signed Up")
        await client.flush(timeout=5)

What to do when is decided by ``DeliveryQueue`` (``_queue.py``), the same as ``Client``'s; this
module only waits: ``_wake`` wakes the delivery task (new calls, a flush, close), ``_progress``
wakes ``flush()`` (calls finished).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from . import _metrics as client_metrics
from ._base import ClientBase
from ._batches import split_batches
from ._log import log
from ._messages import Queued, prepare
from ._methods import OnError
from ._options import DEFAULT_ENDPOINT, DEFAULT_FLUSH_AT, DEFAULT_MAX_QUEUE_SIZE, ClientOptions
from ._queue import Admission, DeliveryQueue, FlushMark, GiveUp, Sending, Wait, as_delivery_error
from ._transports import AsyncHttpTransport, AsyncTransport

__all__ = ["AsyncClient"]

_QUEUED = Admission.QUEUED
_WAKE = Admission.WAKE
#: How long ``close()`` waits for the delivery task to stop after the flush.
_STOP_WAIT = 5.0


class AsyncClient(ClientBase):
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
        options = ClientOptions.build(
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
        self._setup(options, on_error, debug)
        self._own_transport = transport is None
        self._transport: AsyncTransport | None = transport
        if transport is None and options.transport == "kafka":
            self._transport = self._make_transport()  # connects while the first calls queue
        self._queue = DeliveryQueue(options)
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        client_metrics.register(self)

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
        admission = self._queue.put(item)
        if admission is _WAKE:
            self._ensure_task()
            self._wake.set()
        if admission is _WAKE or admission is _QUEUED:
            if log.isEnabledFor(logging.DEBUG):
                self._log_queued(message)
        else:
            self._refused(admission, item)

    def _ensure_task(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            items = await self._next_batch()
            if items is None:
                return
            client_metrics.expose_if_imported()
            if self._transport is None:
                self._transport = self._make_transport()
            for batch in split_batches(items):
                await self._send_with_retries(self._transport, batch)

    async def _next_batch(self) -> list[Queued] | None:
        while True:
            self._wake.clear()
            step = self._queue.next_batch()
            if not isinstance(step, Wait):
                return step
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), step.seconds)

    def _make_transport(self) -> AsyncTransport:
        o = self.options
        if o.transport == "kafka":
            from ._kafka import AsyncKafkaTransport  # only now: it loads confluent-kafka

            args, kwargs = self._kafka_args()
            return AsyncKafkaTransport(*args, **kwargs)
        return AsyncHttpTransport(o.write_key, o.endpoint, gzip=o.gzip, timeout=o.timeout)

    async def _send_with_retries(self, transport: AsyncTransport, batch: list[Queued]) -> None:
        queue = self._queue
        sending = Sending(batch)
        while True:
            gave_up = queue.before_try(sending)
            if gave_up is not None:
                self._finished(gave_up)
                return
            try:
                await transport.send(sending.pending)
            except Exception as exc:
                error = as_delivery_error(exc)
            else:
                queue.delivered(sending)
                self._progress.set()
                return
            step = queue.refused(sending, error)
            self._progress.set()
            if isinstance(step, GiveUp):
                self._gave_up(step)
                return
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._abandoned(), step.delay)

    async def _abandoned(self) -> None:
        while not self._queue.abandoned:
            await self._wake.wait()
            self._wake.clear()

    def _finished(self, gave_up: GiveUp | None) -> None:
        """Wake ``flush()``, then report what was given up."""
        self._progress.set()
        self._gave_up(gave_up)

    async def _wait_flushed(self, mark: FlushMark) -> None:
        while not self._queue.flushed(mark):
            self._progress.clear()
            if self._task is None or self._task.done():
                self._ensure_task()
            await self._progress.wait()

    async def flush(self, timeout: float | None = None) -> bool:
        """Deliver everything queued so far; ``True`` if all was delivered within ``timeout``."""
        queue = self._queue
        mark = queue.request_flush()
        if not queue.flushed(mark):
            self._ensure_task()
            self._wake.set()
            try:
                await asyncio.wait_for(self._wait_flushed(mark), timeout)
            except TimeoutError:
                log.debug("flush timed out with %d calls unfinished", queue.unfinished(mark))
                return False
        return queue.all_delivered(mark)

    async def close(self, timeout: float | None = None) -> bool:
        """Deliver everything queued (within ``timeout``), then stop; later calls are dropped."""
        queue = self._queue
        if queue.closed and self._task is None:
            return not len(queue)
        queue.closed = True
        ok = await self.flush(timeout)
        queue.stop(abandon=not ok)
        self._wake.set()
        task, self._task = self._task, None
        if task is not None:
            try:
                await asyncio.wait_for(task, _STOP_WAIT)
            except TimeoutError:
                log.warning("the delivery task did not stop in time")
        self._finished(queue.drain())
        if self._transport is not None and self._own_transport:
            await self._transport.aclose()
            self._transport = None
        return ok

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()
