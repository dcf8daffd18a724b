"""The public surface of ``pipeline.store`` (everything in a ``_module`` may move)."""

from __future__ import annotations

import pipeline.store
from pipeline.core.exceptions import PipelineError, StoreUnavailable

EXPECTED = {
    "FAILED",
    "LOG_STATES",
    "SCHEMA_VERSION",
    "DestinationStats",
    "EventName",
    "HourFigures",
    "Journey",
    "LogQuery",
    "LogStore",
    "LogWrite",
    "StoreError",
    "StoreUnavailable",
    "Trace",
    "format_log",
    "format_stats",
    "format_trace",
    "trace_link",
    "masked_url",
    "open_store",
}


def test_all_is_exactly_the_public_set() -> None:
    assert set(pipeline.store.__all__) == EXPECTED
    assert len(pipeline.store.__all__) == len(EXPECTED)
    for name in EXPECTED:
        assert hasattr(pipeline.store, name), name


def test_exception_hierarchy() -> None:
    # Unavailable is not the store's fault (the CLI's exit code 3, as Kafka unavailable).
    assert issubclass(pipeline.store.StoreUnavailable, PipelineError)
    assert pipeline.store.StoreUnavailable is StoreUnavailable
    assert issubclass(pipeline.store.StoreError, PipelineError)
    error = pipeline.store.StoreUnavailable("postgresql://app:***@db/log", "connection refused")
    assert str(error) == "log store postgresql://app:***@db/log is unavailable: connection refused"
    assert error.url == "postgresql://app:***@db/log"
