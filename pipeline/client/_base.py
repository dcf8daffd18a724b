"""What ``Client`` and ``AsyncClient`` share above their queue: settings, counters, reporting.

The two differ only in how they wait (a thread with a lock and a condition; an asyncio task with
events). Everything they decide is the same ``DeliveryQueue`` (``_queue.py``), and everything
they show is here.
"""

from __future__ import annotations

from typing import Any

from ._log import DropWarnings, debug_requested, enable_debug_logging, log
from ._messages import UNRESOLVED_SOURCE, Queued
from ._methods import CallMethods, OnError
from ._options import ClientOptions
from ._queue import Admission, DeliveryQueue, GiveUp

__all__ = ["ClientBase"]


class ClientBase(CallMethods):
    """Settings and counters of a client; ``_queue`` is its ``DeliveryQueue``.

    Counters: ``queued`` (waiting now), ``sent`` (delivered), ``dropped`` (queue full or after
    close), ``failed`` (given up), ``batches`` (delivered batch requests).
    """

    options: ClientOptions
    _queue: DeliveryQueue

    def _setup(self, options: ClientOptions, on_error: OnError | None, debug: bool | None) -> None:
        self.options = options
        self.on_error = on_error
        if debug or (debug is None and debug_requested()):
            enable_debug_logging()
        self._source_id = options.source_id or UNRESOLVED_SOURCE
        self._keep_call = options.transport == "kafka"  # the HTTP transport sends bytes
        self._drop_warnings = DropWarnings()

    def _where(self) -> str:
        o = self.options
        if o.transport == "kafka":
            return f"kafka {o.bootstrap_servers} (source {o.source_id})"
        return o.endpoint

    def _kafka_args(self) -> tuple[tuple[str, str], dict[str, Any]]:
        """The Kafka transport's arguments (the same for its thread and asyncio faces)."""
        o = self.options
        assert o.bootstrap_servers is not None and o.source_id is not None
        return (o.bootstrap_servers, o.source_id), {
            "topic_prefix": o.topic_prefix,
            "timeout": o.timeout,
            "config": o.kafka_config,
            "schema_registry_url": o.schema_registry_url,
        }

    # ---- settings and counters -------------------------------------------------------------------

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

    @property
    def sent(self) -> int:
        return self._queue.sent

    @property
    def failed(self) -> int:
        return self._queue.failed

    @property
    def dropped(self) -> int:
        return self._queue.dropped

    @property
    def batches(self) -> int:
        return self._queue.batches

    # ---- calls in, failures out ------------------------------------------------------------------

    def _log_queued(self, message: dict[str, Any]) -> None:
        waiting = len(self._queue)
        log.debug("queued %s %s (%d waiting)", message["type"], message["messageId"], waiting)

    def _refused(self, admission: Admission, item: Queued) -> None:
        error = self._queue.refusal(admission)
        self._drop_warnings.dropped(error)
        self._report(error, [item])

    def _gave_up(self, give_up: GiveUp | None) -> None:
        """Tell ``on_error`` about calls the queue gave up (outside any lock: it is user code)."""
        if give_up is not None and give_up.items:
            self._report(give_up.error, give_up.items)
