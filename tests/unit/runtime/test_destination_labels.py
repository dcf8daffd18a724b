"""The ``destination`` label of the delivery metrics: each destination's id, up to the limit
(``PIPELINE_METRICS_MAX_DESTINATIONS``), then ``other``."""

from __future__ import annotations

from pipeline.runtime.metrics import OTHER_DESTINATIONS, DestinationLabels


def test_ids_up_to_the_limit_then_other() -> None:
    label = DestinationLabels(limit=2)
    assert [label(d) for d in ("a", "b", "c", "a", "d", "b")] == [
        "a",
        "b",
        OTHER_DESTINATIONS,
        "a",
        OTHER_DESTINATIONS,
        "b",
    ]


def test_the_limit_can_be_raised_at_start_up() -> None:
    label = DestinationLabels(limit=1)
    assert label("a") == "a" and label("b") == OTHER_DESTINATIONS
    label.limit = 3
    assert label("c") == "c"
