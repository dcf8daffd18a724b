"""A Prometheus histogram for the event loop's hot path: observed on one thread, without a lock.

``prometheus_client.Histogram.observe`` takes a lock twice (the sum, then the bucket, found by a
scan of the bounds); two of them a delivered call cost the deliver role some 3 % of its CPU. A
``LoopHistogram`` child keeps plain counts, one per bucket, found by bisection; only the thread
that observes writes them (the event loop). A scrape, on the metrics server's thread, reads a
copy of the counts (one C call under the GIL) and derives the count from them, so the buckets
and the count it shows always agree; the sum may lag them by the observation being made.

The exposition is the library's (``HistogramMetricFamily``), the same samples
``prometheus_client.Histogram`` shows but ``_created``:

    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> registry = CollectorRegistry()
    >>> waits = LoopHistogram("waits_seconds", "Waits.", ["queue"], (0.1, 1.0), registry)
    >>> for seconds in (0.05, 0.1, 0.5, 7.0):
    ...     waits.labels("a").observe(seconds)
    >>> print(generate_latest(registry).decode().split("# TYPE waits_seconds histogram")[1].strip())
    waits_seconds_bucket{le="0.1",queue="a"} 2.0
    waits_seconds_bucket{le="1.0",queue="a"} 3.0
    waits_seconds_bucket{le="+Inf",queue="a"} 4.0
    waits_seconds_count{queue="a"} 4.0
    waits_seconds_sum{queue="a"} 7.65
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["LoopHistogram"]

_INF = float("inf")


class _Child:
    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)  # per bucket, not cumulative; the last is +Inf
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        """Count ``amount`` in the first bucket whose bound is at least it."""
        self.counts[bisect_left(self._bounds, amount)] += 1
        self.sum += amount


class LoopHistogram(Collector):
    """A histogram with ``labelnames`` (none: ``observe`` on it directly), whose children are
    observed by one thread only."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        registry: CollectorRegistry | None = REGISTRY,
    ) -> None:
        bounds = tuple(sorted(float(bound) for bound in buckets))
        if bounds[-1] != _INF:
            bounds += (_INF,)
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._bounds = bounds
        self._les: list[str] = [floatToGoString(bound) for bound in bounds]  # type: ignore[no-untyped-call]
        self._children: dict[tuple[str, ...], _Child] = {}
        if not self._labelnames:
            self._children[()] = _Child(bounds)
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> _Child:
        """The child of these label values (made on first use)."""
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self._name}: labels {self._labelnames}, got {values}")
        child = self._children.get(values)
        if child is None:
            child = self._children.setdefault(values, _Child(self._bounds))
        return child

    def observe(self, amount: float) -> None:
        """Observe ``amount`` on the histogram without labels."""
        self._children[()].observe(amount)

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for values, child in list(self._children.items()):
            counts, total = list(child.counts), child.sum
            cumulative, buckets = 0, []
            for le, count in zip(self._les, counts, strict=True):
                cumulative += count
                buckets.append((le, float(cumulative)))
            family.add_metric(list(values), buckets, total)
        yield family
