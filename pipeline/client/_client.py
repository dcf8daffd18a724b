"""``Client``: queue calls in memory, deliver them in batches from one background thread.

Why it is shaped like this (what users of other analytics libraries run into, fixed here):

- A call method validates, appends to a bounded deque under a lock, and returns. It never waits
  for the network or for the worker: when the queue is full the call is dropped, counted in
  ``dropped`` and reported to ``on_error``. The lock is held only to append and, twice per batch,
  to wake the worker.
- ``flush(timeout)`` waits until every call queued before it is finished (delivered, or reported
  to ``on_error``), and says whether all were delivered. Counting is by sequence: the queue is
  first in, first out, so "finished ≥ accepted at flush time" means everything before is done.
- ``close()`` delivers everything queued, then stops the worker. An interpreter exit closes
  every open client (``atexit``), waiting at most ``exit_timeout``.
- After ``os.fork()`` the child starts empty: a new lock, queue and worker, and a new transport.
  The parent's transport is deliberately leaked in the child: destroying a librdkafka producer
  created before the fork tries to join threads that do not exist there, and closing a shared
  TLS socket would send a close_notify on the parent's connection.
- Retries happen in the worker with jittered exponential backoff (``Retry-After`` wins); a closing
  client stops retrying when its ``close`` timeout runs out and reports what is left.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import threading
import time
import weakref
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
from ._transports import HttpTransport, KafkaTransport, Transport

__all__ = ["Client", "OnError"]

#: ``on_error(error, messages)``: called from the worker thread.

_LIVE: weakref.WeakSet[Client] = weakref.WeakSet()


def _leak(obj: object) -> None:
    """Keep ``obj`` alive for ever (its destructor must not run in a forked child)."""
    if obj is not None:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def _after_fork_in_child() -> None:
    for client in list(_LIVE):
        client._reset_after_fork()


def _close_all_at_exit() -> None:
    for client in list(_LIVE):
        try:
            client.close(client.options.exit_timeout)
        except Exception:  # pragma: no cover - never let one client stop the others
            log.exception("closing a client at exit failed")


if hasattr(os, "register_at_fork"):  # every POSIX system; Windows has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_all_at_exit)


class Client(CallMethods):
    """The analytics client (seed §2.4, §4.3).

        client = Client("wk_live_1")                     # HTTP to pipeline ingest
        client.track(user_id="u1", event="Signed Up", properties={"plan": "pro"})
        client.flush(timeout=5)                          # True once everything is delivered
        client.close()

    Kafka directly, for a known source: ``Client("", bootstrap_servers="kafka:9092",
    source_id="web")`` (the write key is not needed; the calls are written for ``source_id``).

    Counters: ``queued`` (waiting now), ``sent`` (delivered), ``dropped`` (queue full or after
    close), ``failed`` (given up), ``batches`` (delivered batch requests).
    """

    _transport: Transport | None

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
        exit_timeout: float = 10.0,
        debug: bool | None = None,
        transport: Transport | None = None,
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
            exit_timeout=exit_timeout,
        )
        self.on_error = on_error
        if debug or (debug is None and debug_requested()):
            enable_debug_logging()
        self._given_transport = transport
        self._source_id = source_id or UNRESOLVED_SOURCE
        self._keep_call = self.options.transport == "kafka"  # the HTTP transport sends bytes
        self._closed = False
        self._drop_warnings = DropWarnings()
        self._init_state()
        if self._transport is None and self.options.transport == "kafka":
            self._transport = self._make_transport()  # connects while the first calls queue
        _LIVE.add(self)
        log.debug(
            "client for %s: flush_at=%d flush_after=%gs max_queue_size=%d",
            self._where(),
            self.options.flush_at,
            self.options.flush_after,
            self.options.max_queue_size,
        )

    # ---- state -----------------------------------------------------------------------------------

    def _init_state(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[Queued] = deque()
        self._accepted = 0  # calls ever queued
        self._finished = 0  # calls delivered or given up, in queue order
        self._flush_requested = False
        self._stopping = False  # deliver what is queued, then stop
        self._abandon = False  # stop now (close timed out)
        self._last_flush = time.monotonic()
        self._oldest: float | None = None  # when the queue last became non-empty
        self._worker: threading.Thread | None = None
        self._transport = self._given_transport
        self.sent = 0
        self.dropped = 0
        client_metrics.register(self)
        self.failed = 0
        self.batches = 0

    def _reset_after_fork(self) -> None:
        if self._transport is not self._given_transport:
            _leak(self._transport)
        self._init_state()

    def _where(self) -> str:
        o = self.options
        if o.transport == "kafka":
            return f"kafka {o.bootstrap_servers} (source {o.source_id})"
        return o.endpoint

    @property
    def flush_at(self) -> int:
        return self.options.flush_at

    @property
    def size(self) -> int:
        """The same setting as ``flush_at`` (the seed names both)."""
        return self.options.flush_at

    @property
    def flush_after(self) -> float:
        return self.options.flush_after

    @property
    def queued(self) -> int:
        return len(self._queue)

    # ---- the calls (identify, track, ... come from CallMethods) ---------------------------------

    def _enqueue(self, message: dict[str, Any], now: int) -> None:
        item = prepare(
            message, event_time=now, source_id=self._source_id, keep_call=self._keep_call
        )
        refused: Exception | None = None
        cond = self._cond
        with cond:
            if self._closed:
                refused = ClientClosed("the client is closed; the call was dropped")
            elif len(self._queue) >= self.options.max_queue_size:
                refused = QueueFull(self.options.max_queue_size)
            else:
                queue = self._queue
                queue.append(item)
                self._accepted += 1
                waiting = len(queue)
                if waiting == 1:
                    self._oldest = time.monotonic()
                if waiting == 1 or waiting == self.options.flush_at:
                    self._start_worker()
                    cond.notify()
            if refused is not None:
                self.dropped += 1
                client_metrics.DROPPED.labels(
                    "closed" if isinstance(refused, ClientClosed) else "queue_full"
                ).inc()
        if refused is None:
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "queued %s %s (%d waiting)", message["type"], message["messageId"], waiting
                )
            return
        self._drop_warnings.dropped(refused)
        self._report(refused, [item])

    # ---- the worker ------------------------------------------------------------------------------

    def _start_worker(self) -> None:
        """Start (or restart) the worker thread; the caller holds the lock."""
        if self._worker is not None and self._worker.is_alive():
            return
        self._worker = threading.Thread(target=self._run, name="pipeline-client", daemon=True)
        self._worker.start()

    def _run(self) -> None:
        while True:
            items = self._next_batch()
            if items is None:
                return
            try:
                self._deliver(items)
            except Exception as exc:  # pragma: no cover - a bug; never lose the count
                log.exception("delivering a batch failed")
                self._finish(items, failed=exc)

    def _next_batch(self) -> list[Queued] | None:
        """Wait for a reason to flush, then take everything queued; ``None``: stop."""
        options = self.options
        with self._cond:
            while True:
                if self._abandon:
                    return None
                waiting = len(self._queue)
                if not waiting:
                    self._flush_requested = False
                    if self._stopping:
                        return None
                    self._cond.wait()
                    continue
                now = time.monotonic()
                due = max(self._last_flush, self._oldest or now) + options.flush_after
                if (
                    waiting >= options.flush_at
                    or self._flush_requested
                    or self._stopping
                    or now >= due
                ):
                    items = list(self._queue)
                    self._queue.clear()
                    self._flush_requested = False
                    self._last_flush = now
                    self._oldest = None
                    return items
                self._cond.wait(due - now)

    def _deliver(self, items: list[Queued]) -> None:
        if self._transport is None:
            self._transport = self._make_transport()
        for batch in split_batches(items):
            self._send_with_retries(self._transport, batch)

    def _make_transport(self) -> Transport:
        o = self.options
        if o.transport == "kafka":
            assert o.bootstrap_servers is not None and o.source_id is not None
            return KafkaTransport(
                o.bootstrap_servers,
                o.source_id,
                topic_prefix=o.topic_prefix,
                timeout=o.timeout,
                config=o.kafka_config,
                schema_registry_url=o.schema_registry_url,
            )
        return HttpTransport(o.write_key, o.endpoint, gzip=o.gzip, timeout=o.timeout)

    def _send_with_retries(self, transport: Transport, batch: list[Queued]) -> None:
        pending: Sequence[Queued] = batch
        attempt = 0
        while True:
            if self._abandon:
                self._finish(pending, failed=ClientClosed("closed before these calls were sent"))
                return
            started = time.monotonic()
            try:
                transport.send(pending)
            except DeliveryError as exc:
                error = exc
            except Exception as exc:  # an unexpected transport failure: retry it like a network one
                log.exception("sending a batch failed")
                error = DeliveryError(f"{type(exc).__name__}: {exc}", retryable=True)
            else:
                log.debug(
                    "delivered %d calls in %.0f ms",
                    len(pending),
                    (time.monotonic() - started) * 1000,
                )
                self._finish(pending, batch=True)
                return
            if error.pending is not None:  # delivered in part: only the rest is left
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
            with self._cond:
                self._cond.wait_for(lambda: self._abandon, delay)  # close() may cut it short

    def _finish(
        self, items: Sequence[Queued], *, failed: Exception | None = None, batch: bool = False
    ) -> None:
        with self._cond:
            self._finished += len(items)
            if failed is None:
                self.sent += len(items)
                self.batches += batch
            else:
                self.failed += len(items)
                client_metrics.FAILED.inc(len(items))
            self._cond.notify_all()
        if failed is not None and items:
            self._report(failed, items)

    # ---- flush and close -------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Deliver everything queued so far; ``True`` if all of it was delivered within
        ``timeout`` seconds (``None``: no limit), ``False`` if time ran out or calls failed."""
        if threading.current_thread() is self._worker:
            raise RuntimeError("flush() cannot be called from on_error (the worker thread)")
        with self._cond:
            target = self._accepted
            failed_before = self.failed
            if self._finished < target:
                self._flush_requested = True
                self._start_worker()
                self._cond.notify_all()
                if not self._cond.wait_for(lambda: self._finished >= target, timeout):
                    log.debug("flush timed out with %d calls unfinished", target - self._finished)
                    return False
            return self.failed == failed_before

    def close(self, timeout: float | None = None) -> bool:
        """Deliver everything queued (within ``timeout``), then stop; later calls are dropped.

        Returns what ``flush`` returns. Calls still undelivered when time runs out are reported
        to ``on_error`` as ``ClientClosed`` and counted in ``failed``.
        """
        with self._cond:
            if self._closed and self._worker is None:
                return not self._queue
            self._closed = True
        deadline = None if timeout is None else time.monotonic() + timeout
        ok = self.flush(timeout)
        with self._cond:
            self._stopping = True
            self._abandon = not ok
            self._cond.notify_all()
            worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            left = 5.0 if deadline is None else max(0.1, deadline - time.monotonic())
            worker.join(left)
        with self._cond:
            leftover = list(self._queue)
            self._queue.clear()
            stuck = worker is not None and worker.is_alive()
            self._worker = None
        if leftover:
            self._finish(leftover, failed=ClientClosed(f"closed with {len(leftover)} calls queued"))
        if (
            self._transport is not None
            and not stuck
            and self._transport is not self._given_transport
        ):
            try:
                self._transport.close()
            except Exception:  # pragma: no cover
                log.exception("closing the transport failed")
            self._transport = None
        _LIVE.discard(self)
        log.debug("closed: %d sent, %d failed, %d dropped", self.sent, self.failed, self.dropped)
        return ok

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
