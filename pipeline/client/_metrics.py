"""The client library's metrics, for the process's Prometheus registry, without importing it.

Counting is plain Python, on rare paths only (a dropped call, a call given up); the queue depth is
computed when Prometheus scrapes, from every live client. ``prometheus_client`` is imported only
when the application uses it: the collector joins its default registry when the module is already
imported as a client is made or delivers a batch, or when ``register_collector()`` is called. An
application that serves ``/metrics`` (``prometheus_client.start_http_server``) exposes them with
its own; one that only sends calls over HTTP never pays for the import (~25 ms).

The counts are the process's since it started, whenever the collector joined the registry, so
a late registration loses nothing.
"""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

__all__ = [
    "count_dropped",
    "count_failed",
    "expose_if_imported",
    "register",
    "register_collector",
]

QUEUE_DEPTH = "pipeline_client_queue_depth"
DROPPED = "pipeline_client_dropped_calls"
FAILED = "pipeline_client_failed_calls"
#: The reasons a call is dropped (``Admission`` values), each always exported.
DROP_REASONS = ("queue_full", "closed")


class _HasQueue(Protocol):
    @property
    def queued(self) -> int: ...


class _Counts:
    """The process's totals; a lock, because clients of several threads count into them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.dropped = dict.fromkeys(DROP_REASONS, 0)
        self.failed = 0


_counts = _Counts()
_clients: weakref.WeakSet[_HasQueue] = weakref.WeakSet()
_registered: set[int] = set()  # id() of the registries the collector is in


def _new_lock_in_child() -> None:
    # A lock held by another thread at fork() would stay locked for ever in the child.
    _counts.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


def count_dropped(reason: str) -> None:
    with _counts.lock:
        _counts.dropped[reason] += 1


def count_failed(count: int) -> None:
    with _counts.lock:
        _counts.failed += count


def register(client: _HasQueue) -> None:
    """Count ``client``'s queue in the depth gauge (for as long as it lives)."""
    _clients.add(client)
    expose_if_imported()


def expose_if_imported() -> None:
    """Join the default registry if the application imported ``prometheus_client`` (cheap:
    a dictionary look-up once registered or while it is not imported)."""
    if not _registered and "prometheus_client" in sys.modules:
        register_collector()


def register_collector(registry: CollectorRegistry | None = None) -> None:
    """Export the client metrics from ``registry`` (the default one unless given); once each."""
    from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector

    target = REGISTRY if registry is None else registry
    if id(target) in _registered:
        return

    class ClientCollector(Collector):
        def collect(self) -> Iterator[Any]:
            depth = GaugeMetricFamily(
                QUEUE_DEPTH, "Calls queued in this process's pipeline.client clients."
            )
            depth.add_metric([], float(sum(client.queued for client in list(_clients))))
            dropped = CounterMetricFamily(
                DROPPED,
                "Calls a client refused to queue (reason: queue_full, closed).",
                labels=["reason"],
            )
            failed = CounterMetricFamily(
                FAILED, "Queued calls a client gave up delivering (after retries)."
            )
            with _counts.lock:
                for reason, count in _counts.dropped.items():
                    dropped.add_metric([reason], float(count))
                failed.add_metric([], float(_counts.failed))
            yield from (depth, dropped, failed)

    target.register(ClientCollector())
    _registered.add(id(target))
