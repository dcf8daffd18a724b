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
- What to do when is decided by ``DeliveryQueue`` (``_queue.py``), shared with ``AsyncClient``;
  this module only waits: every queue method is called under the lock, and the condition wakes
  the worker (new calls, a flush, close) and the flushing callers (progress).
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from pipeline.core.deadline import Deadline

from . import _metrics as client_metrics
from ._base import ClientBase
from ._batches import split_batches
from ._log import log
from ._messages import Queued, prepare
from ._methods import OnError
from ._options import DEFAULT_ENDPOINT, DEFAULT_FLUSH_AT, DEFAULT_MAX_QUEUE_SIZE, ClientOptions
from ._queue import Admission, DeliveryQueue, GiveUp, Sending, Wait, as_delivery_error
from ._transports import HttpTransport, Transport

__all__ = ["Client", "OnError"]

_LIVE: weakref.WeakSet[Client] = weakref.WeakSet()
_QUEUED = Admission.QUEUED
_WAKE = Admission.WAKE
#: How long ``close()`` without a timeout waits for the worker to stop after the flush.
_STOP_WAIT = 5.0


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


class Client(ClientBase):
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
            exit_timeout=exit_timeout,
        )
        self._setup(options, on_error, debug)
        self._given_transport = transport
        self._init_state(closed=False)
        if self._transport is None and options.transport == "kafka":
            self._transport = self._make_transport()  # connects while the first calls queue
        _LIVE.add(self)
        log.debug(
            "client for %s: flush_at=%d flush_after=%gs max_queue_size=%d",
            self._where(),
            options.flush_at,
            options.flush_after,
            options.max_queue_size,
        )

    # ---- state -----------------------------------------------------------------------------------

    def _init_state(self, *, closed: bool) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._queue = DeliveryQueue(self.options)
        self._queue.closed = closed
        self._worker: threading.Thread | None = None
        self._transport = self._given_transport
        client_metrics.register(self)

    def _reset_after_fork(self) -> None:
        if self._transport is not self._given_transport:
            _leak(self._transport)
        self._init_state(closed=self._queue.closed)

    # ---- the calls (identify, track, ... come from CallMethods) ---------------------------------

    def _enqueue(self, message: dict[str, Any], now: int) -> None:
        item = prepare(
            message, event_time=now, source_id=self._source_id, keep_call=self._keep_call
        )
        cond = self._cond
        with cond:
            admission = self._queue.put(item)
            if admission is _WAKE:
                self._start_worker()
                cond.notify()
        if admission is _WAKE or admission is _QUEUED:
            if log.isEnabledFor(logging.DEBUG):
                self._log_queued(message)
        else:
            self._refused(admission, item)

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
            client_metrics.expose_if_imported()
            try:
                self._deliver(items)
            except Exception as exc:  # pragma: no cover - a bug; never lose the count
                log.exception("delivering a batch failed")
                with self._cond:
                    gave_up = self._queue.give_up(items, exc)
                    self._cond.notify_all()
                self._gave_up(gave_up)

    def _next_batch(self) -> list[Queued] | None:
        """Wait for a reason to flush, then take everything queued; ``None``: stop."""
        with self._cond:
            while True:
                step = self._queue.next_batch()
                if not isinstance(step, Wait):
                    return step
                self._cond.wait(step.seconds)

    def _deliver(self, items: list[Queued]) -> None:
        if self._transport is None:
            self._transport = self._make_transport()
        for batch in split_batches(items):
            self._send_with_retries(self._transport, batch)

    def _make_transport(self) -> Transport:
        o = self.options
        if o.transport == "kafka":
            from ._kafka import KafkaTransport  # only now: it loads confluent-kafka

            args, kwargs = self._kafka_args()
            return KafkaTransport(*args, **kwargs)
        return HttpTransport(o.write_key, o.endpoint, gzip=o.gzip, timeout=o.timeout)

    def _send_with_retries(self, transport: Transport, batch: list[Queued]) -> None:
        queue, cond = self._queue, self._cond
        sending = Sending(batch)
        while True:
            with cond:
                gave_up = queue.before_try(sending)
                if gave_up is not None:
                    cond.notify_all()
            if gave_up is not None:
                self._gave_up(gave_up)
                return
            try:
                transport.send(sending.pending)
            except Exception as exc:
                error = as_delivery_error(exc)
            else:
                with cond:
                    queue.delivered(sending)
                    cond.notify_all()
                return
            with cond:
                step = queue.refused(sending, error)
                cond.notify_all()
            if isinstance(step, GiveUp):
                self._gave_up(step)
                return
            with cond:
                cond.wait_for(lambda: queue.abandoned, step.delay)  # close() may cut it short

    # ---- flush and close -------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> bool:
        """Deliver everything queued so far; ``True`` if all of it was delivered within
        ``timeout`` seconds (``None``: no limit), ``False`` if time ran out or calls failed."""
        if threading.current_thread() is self._worker:
            raise RuntimeError("flush() cannot be called from on_error (the worker thread)")
        queue = self._queue
        with self._cond:
            mark = queue.request_flush()
            if not queue.flushed(mark):
                self._start_worker()
                self._cond.notify_all()
                if not self._cond.wait_for(lambda: queue.flushed(mark), timeout):
                    log.debug("flush timed out with %d calls unfinished", queue.unfinished(mark))
                    return False
            return queue.all_delivered(mark)

    def close(self, timeout: float | None = None) -> bool:
        """Deliver everything queued (within ``timeout``), then stop; later calls are dropped.

        Returns what ``flush`` returns. Calls still undelivered when time runs out are reported
        to ``on_error`` as ``ClientClosed`` and counted in ``failed``.
        """
        queue = self._queue
        with self._cond:
            if queue.closed and self._worker is None:
                return not len(queue)
            queue.closed = True
        deadline = Deadline.after(timeout)
        ok = self.flush(timeout)
        with self._cond:
            queue.stop(abandon=not ok)
            self._cond.notify_all()
            worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join(_STOP_WAIT if timeout is None else max(0.1, deadline.remaining()))
        with self._cond:
            leftover = queue.drain()
            stuck = worker is not None and worker.is_alive()
            self._worker = None
            self._cond.notify_all()
        self._gave_up(leftover)
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
