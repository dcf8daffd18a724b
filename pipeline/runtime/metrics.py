"""Prometheus metrics. Label sets are bounded: never a user id, a URL or a message id.

Each process serves its own ``/metrics`` (``--metrics-port``); Prometheus adds the counters of
several worker processes up, so scaling out needs nothing special here.
"""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

from prometheus_client import Counter, Gauge, start_http_server

from pipeline.runtime.loop_histogram import LoopHistogram

__all__ = [
    "CALLS_INGESTED",
    "CALLS_REJECTED",
    "CALLS_ROUTED",
    "CALLS_DROPPED",
    "DELIVERIES_ROUTED",
    "ROUTER_TRANSACTIONS",
    "DELIVERIES",
    "DELIVERY_ATTEMPT_SECONDS",
    "END_TO_END_SECONDS",
    "RETRIES",
    "DEAD_LETTERS",
    "CIRCUITS_OPEN",
    "PARKED",
    "SUPPRESSED",
    "UNKNOWN_DESTINATION",
    "OTHER_DESTINATIONS",
    "DestinationLabels",
    "destination_label",
    "configure_destination_labels",
    "IN_FLIGHT",
    "CONSUMER_LAG",
    "LOG_STORE_WRITTEN",
    "LOG_STORE_UNDECODABLE",
    "serve_metrics",
    "record_kafka_stats",
]

log = logging.getLogger("pipeline.metrics")

CALLS_INGESTED = Counter(
    "pipeline_calls_ingested", "Calls accepted and acknowledged by Kafka.", ["type"]
)
CALLS_REJECTED = Counter("pipeline_calls_rejected", "Calls refused at ingestion.", ["reason"])
CALLS_ROUTED = Counter("pipeline_calls_routed", "Calls the router read, by type.", ["type"])
CALLS_DROPPED = Counter(
    "pipeline_calls_dropped",
    "Calls the router did not deliver anywhere, by reason "
    "(blocked_event, no_destination, unknown_source).",
    ["reason"],
)
DELIVERIES_ROUTED = Counter(
    "pipeline_deliveries_routed", "Delivery records the router wrote (one per destination)."
)
ROUTER_TRANSACTIONS = Counter(
    "pipeline_router_transactions",
    "Router transactions by result (committed, aborted: tried again, fenced).",
    ["result"],
)
DELIVERIES = Counter(
    "pipeline_deliveries",
    "Delivery attempts by destination and outcome (delivered, retry, dead_letter).",
    ["destination", "outcome"],
)
# The two histograms of every delivery are observed on the event loop only: ``LoopHistogram``.
DELIVERY_ATTEMPT_SECONDS = LoopHistogram(
    "pipeline_delivery_attempt_seconds",
    "Duration of one delivery attempt (all webhooks of a destination at once), by destination.",
    ["destination"],
    (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
END_TO_END_SECONDS = LoopHistogram(
    "pipeline_end_to_end_seconds",
    "From the call's arrival at the pipeline to its delivery.",
    (),
    (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, 14400),
)
RETRIES = Counter(
    "pipeline_retries",
    "Deliveries handed to a retry tier, by destination.",
    ["destination", "tier"],
)
DEAD_LETTERS = Counter(
    "pipeline_dead_letters",
    "Records sent to the dead-letter topic, by destination (`unknown`: not decodable) and reason.",
    ["destination", "reason"],
)
PARKED = Counter(
    "pipeline_parked",
    "Records set aside for a later tier without an attempt, decode or re-encode, by destination "
    "and reason (circuit_open: every webhook's circuit is open; in_flight: the destination has "
    "its max_in_flight; silent: its webhooks have requests out and none came back for ten times "
    "their usual answer time (at least 0.25 s); unanswered: its first requests have been out 50 ms "
    "and none of its webhooks has answered yet, and it has as many records out as its host has "
    "connections; rate_limited: its turn under rate_limit is more than half a second away; back_off: its "
    "receiver asked for a pause with Retry-After).",
    ["destination", "reason"],
)
SUPPRESSED = Counter(
    "pipeline_suppressed",
    "Deliveries not made because a deletion request for the user came after the call, by "
    "destination (each is a `suppressed` entry in the delivery log).",
    ["destination"],
)
ORDERING_HELD_USERS = Gauge(
    "pipeline_ordering_held_users",
    "Users of an ordered destination whose calls wait behind one of theirs in a retry tier, in "
    "the partitions this worker owns (sum over workers: the destination's held users).",
    ["destination"],
)
DESTINATION_PACE = Gauge(
    "pipeline_destination_pace",
    "Requests per second the deployment sends a destination at most: its rate_limit, or the pace "
    "its 429s lowered it to (no series: no limit).",
    ["destination"],
)
DESTINATION_PAUSED = Gauge(
    "pipeline_destination_paused_seconds",
    "Seconds left of the pause a destination's receiver asked for (Retry-After on 429 or 503); "
    "0: not paused.",
    ["destination"],
)
CIRCUITS_OPEN = Gauge(
    "pipeline_circuits_open",
    "Webhooks of a destination whose circuit (or whose host's) is open or half open, as this "
    "worker saw it at its last attempt there.",
    ["destination"],
)
LOG_STORE_WRITTEN = Counter(
    "pipeline_log_store_entries", "Delivery log entries the log-store wrote to its store."
)
LOG_STORE_UNDECODABLE = Counter(
    "pipeline_log_store_undecodable", "Records of deliveries.log the log-store could not read."
)
IN_FLIGHT = Gauge("pipeline_in_flight", "Records a worker is working on now.", ["role"])
PARTITIONS_HELD = Gauge(
    "pipeline_partitions_held",
    "Partitions the group has assigned to this worker now, by role (how the group split them).",
    ["role"],
)
CONSUMER_LAG = Gauge(
    "pipeline_consumer_lag",
    "Records behind the end of the partition, from librdkafka statistics "
    "(approximate on the embedded broker).",
    ["topic", "partition"],
)


#: The ``destination`` label of a record whose destination is not known (it did not decode).
UNKNOWN_DESTINATION = "unknown"
#: The ``destination`` label shared by every destination past the limit.
OTHER_DESTINATIONS = "other"


class DestinationLabels:
    """The ``destination`` label value of each destination id: the id itself for the first
    ``limit`` ids a process sees (``PIPELINE_METRICS_MAX_DESTINATIONS``), ``other`` after that,
    so thousands of destinations cannot swamp Prometheus with series."""

    def __init__(self, limit: int = 1000) -> None:
        self.limit = limit
        self._labels: dict[str, str] = {}

    def __call__(self, destination: str) -> str:
        label = self._labels.get(destination)
        if label is None:
            admitted = len(self._labels) < self.limit
            label = destination if admitted else OTHER_DESTINATIONS
            if admitted:
                self._labels[destination] = label
        return label


#: The process's labels (``configure_destination_labels`` sets the limit at start-up).
destination_label = DestinationLabels()


def configure_destination_labels(limit: int) -> None:
    destination_label.limit = limit


def serve_metrics(port: int | None, host: str = "0.0.0.0") -> None:  # noqa: S104
    """Serve ``/metrics`` on ``port`` in a background thread (``None`` or 0: not at all)."""
    if port:
        start_http_server(port, addr=host)
        log.info("metrics on http://%s:%d/metrics", host, port)


def record_kafka_stats(stats_json: str) -> None:
    """librdkafka ``stats_cb``: consumer lag per assigned partition."""
    try:
        stats: dict[str, Any] = json.loads(stats_json)
    except ValueError:
        return
    for topic, info in stats.get("topics", {}).items():
        for partition, pstats in info.get("partitions", {}).items():
            if partition == "-1":
                continue
            lag = pstats.get("consumer_lag", -1)
            if lag is not None and lag >= 0:
                CONSUMER_LAG.labels(topic, partition).set(lag)
            else:
                # Not (or no longer) ours, e.g. revoked in a rebalance: drop the series, or this
                # process would report its last value for ever next to the new owner's.
                with contextlib.suppress(KeyError):
                    CONSUMER_LAG.remove(topic, partition)
