"""The client library's metrics, in the process's Prometheus registry.

Nothing runs per call: the queue depth is computed when Prometheus scrapes, from every live
client of the process; drops and give-ups are counted on their (rare) paths. An application that
serves ``/metrics`` (``prometheus_client.start_http_server``) exposes them with its own.
"""

from __future__ import annotations

import weakref
from typing import Protocol

from prometheus_client import Counter, Gauge

__all__ = ["QUEUE_DEPTH", "DROPPED", "FAILED", "register"]


class _HasQueue(Protocol):
    @property
    def queued(self) -> int: ...


_clients: weakref.WeakSet[_HasQueue] = weakref.WeakSet()

QUEUE_DEPTH = Gauge(
    "pipeline_client_queue_depth", "Calls queued in this process's pipeline.client clients."
)
QUEUE_DEPTH.set_function(lambda: sum(client.queued for client in list(_clients)))
DROPPED = Counter(
    "pipeline_client_dropped_calls",
    "Calls a client refused to queue (reason: queue_full, closed).",
    ["reason"],
)
FAILED = Counter(
    "pipeline_client_failed_calls", "Queued calls a client gave up delivering (after retries)."
)


def register(client: _HasQueue) -> None:
    _clients.add(client)
