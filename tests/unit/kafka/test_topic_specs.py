"""What ``topics create`` asks for: the calls topic's retention is the replay window."""

from __future__ import annotations

import pytest

from pipeline.core.settings import Settings
from pipeline.kafka.clients import topic_specs


def specs(settings: Settings) -> dict[str, dict[str, str]]:
    return {spec.topic: spec.config for spec in topic_specs(settings)}


def test_the_calls_topic_keeps_calls_for_the_replay_window() -> None:
    assert specs(Settings())["calls"]["retention.ms"] == str(7 * 86_400_000)
    settings = Settings.from_env({"PIPELINE_CALLS_RETENTION": "3d"})
    assert specs(settings)["calls"]["retention.ms"] == str(3 * 86_400_000)


def test_replays_are_kept_in_a_compacted_topic() -> None:
    assert specs(Settings(topic_prefix="p."))["p.replays"] == {"cleanup.policy": "compact"}


def test_a_calls_retention_under_a_minute_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="PIPELINE_CALLS_RETENTION: must be at least 1m"):
        Settings.from_env({"PIPELINE_CALLS_RETENTION": "30s"})
