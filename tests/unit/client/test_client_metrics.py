"""The client library's metrics: queue depth, dropped and failed calls (no network needed)."""

from __future__ import annotations

from prometheus_client import REGISTRY

from pipeline.client import Client
from pipeline.client._metrics import register_collector


def _value(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_queue_depth_and_dropped_calls_are_exported() -> None:
    # In the registry before the "before" values are read: the counts are the process's, and an
    # earlier test in this process may have dropped calls before any client joined the registry.
    register_collector()
    before_depth = _value("pipeline_client_queue_depth")
    before_full = _value("pipeline_client_dropped_calls_total", reason="queue_full")
    before_closed = _value("pipeline_client_dropped_calls_total", reason="closed")
    before_failed = _value("pipeline_client_failed_calls_total")
    client = Client(
        "wk",
        endpoint="http://127.0.0.1:9",  # nothing listens: every send fails at once
        flush_at=1000,
        flush_after=3600,
        max_queue_size=2,
        max_retries=0,
    )
    for n in range(3):
        client.track(user_id="u", event=f"E{n}")

    assert client.dropped == 1
    assert _value("pipeline_client_queue_depth") == before_depth + 2
    assert _value("pipeline_client_dropped_calls_total", reason="queue_full") == before_full + 1

    client.close()  # the two queued calls fail to deliver (nothing listens): given up
    client.track(user_id="u", event="after close")
    assert _value("pipeline_client_dropped_calls_total", reason="closed") == before_closed + 1
    assert _value("pipeline_client_failed_calls_total") == before_failed + 2
    assert _value("pipeline_client_queue_depth") == before_depth
