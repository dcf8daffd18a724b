"""Unit tests for ``config_data``: the live table back as the config file (``config export``).

The contract: ``validate_config`` of what it returns builds models equal to the table's, so an
export applied again changes nothing.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings

from pipeline.core.config import (
    Batch,
    ConfigTable,
    Destination,
    Ordering,
    PreviousSecret,
    RetryPolicy,
    Signing,
    Source,
    Webhook,
    validate_config,
)
from pipeline.core.config_export import config_data
from pipeline.core.signing import new_signing_key

from ._config_tables import config_tables

KEY = new_signing_key()
FULL = Destination(
    id="hooks",
    name="Webhooks",
    enabled=False,
    sources=["web", "ios"],
    shared_secret="s3cret",
    previous_secrets=[PreviousSecret(secret="old-s3cret", until="2026-11-30T12:00:00Z")],
    standard_webhooks=True,
    signing=Signing.ED25519,
    signing_key=KEY,
    rate_limit=50.0,
    retry=RetryPolicy(delays=[10.0, 60.0, 300.0, 1800.0, 3600.0], deadline=4 * 3600.0),
    max_in_flight=200,
    disable_after=86_400.0,
    ordering=Ordering.PER_USER,
    webhooks=[
        Webhook(url="https://example.com/h", headers={"Authorization": "Bearer abc"}),
        Webhook(url="http://127.0.0.1:8090/x"),
    ],
    disabled_reason="every attempt failed for 1d (disable_after 1d)",
    disabled_at=1_795_273_500_000,
    trace_context=False,
)
PLAIN = Destination(id="plain", sources=["web"], webhooks=[Webhook(url="https://example.org/")])
BATCHED = PLAIN.model_copy(
    update={"id": "queued", "batch": Batch(max_events=50, max_bytes=65536, max_wait=0.25)}
)
SOURCES = [
    Source(id="web", name="Website", write_keys=["wk_live_1"], blocked_events=["Debug Event"]),
    Source(id="ios"),
]
TABLE = ConfigTable.build(SOURCES, [PLAIN, FULL, BATCHED])


def rebuilt(data: dict[str, Any]) -> ConfigTable:
    config = validate_config(data)
    return ConfigTable.build(config.sources, config.destinations)


def test_a_table_with_every_field_set_comes_back_equal() -> None:
    assert rebuilt(config_data(TABLE)) == TABLE


def test_sources_then_destinations_sorted_by_id_with_the_documented_key_order() -> None:
    data = config_data(TABLE)
    assert list(data) == ["sources", "destinations"]
    assert [s["id"] for s in data["sources"]] == ["ios", "web"]
    assert [d["id"] for d in data["destinations"]] == ["hooks", "plain", "queued"]
    assert list(data["destinations"][0]) == [
        "id",
        "name",
        "enabled",
        "sources",
        "shared_secret",
        "previous_secrets",
        "standard_webhooks",
        "signing",
        "signing_key",
        "trace_context",
        "webhooks",
        "retry",
        "max_in_flight",
        "rate_limit",
        "disable_after",
        "ordering",
        "disabled_reason",
        "disabled_at",
    ]


def test_fields_at_their_default_are_left_out() -> None:
    data = config_data(TABLE)
    assert data["sources"][0] == {"id": "ios"}
    assert data["destinations"][1] == {
        "id": "plain",
        "name": "Webhooks",
        "enabled": True,
        "sources": ["web"],
        "webhooks": [{"url": "https://example.org/"}],
    }


def test_durations_are_the_text_the_file_takes_and_exact() -> None:
    hooks = config_data(TABLE)["destinations"][0]
    assert hooks["retry"] == {"delays": ["10s", "1m", "5m", "30m", "1h"], "deadline": "4h"}
    assert hooks["disable_after"] == "1d"
    assert hooks["rate_limit"] == 50
    odd = PLAIN.model_copy(update={"retry": RetryPolicy(delays=[1.5, 1.0004]), "rate_limit": 2.5})
    data = config_data(ConfigTable.build(SOURCES, [odd]))["destinations"][0]
    assert data["retry"] == {"delays": ["1500ms", 1.0004]}  # no unit says 1.0004 s exactly
    assert data["rate_limit"] == 2.5


def test_the_ordering_is_its_value_as_plain_text() -> None:
    hooks = config_data(TABLE)["destinations"][0]
    assert hooks["ordering"] == "per_user"
    assert type(hooks["ordering"]) is str  # yaml.safe_dump refuses an enum


def test_a_batch_is_written_whole_in_the_units_the_file_takes() -> None:
    queued = config_data(TABLE)["destinations"][2]
    assert list(queued)[-1] == "batch"
    assert queued["batch"] == {"max_events": 50, "max_bytes": 65536, "max_wait": "250ms"}
    round_sizes = BATCHED.model_copy(update={"batch": Batch(max_bytes="2MB")})
    data = config_data(ConfigTable.build(SOURCES, [round_sizes]))["destinations"][0]
    assert data["batch"] == {"max_events": 100, "max_bytes": "2MB", "max_wait": "1s"}


def test_secrets_are_exported() -> None:
    hooks = config_data(TABLE)["destinations"][0]
    assert hooks["shared_secret"] == "s3cret"
    assert (hooks["signing"], hooks["signing_key"]) == ("ed25519", KEY)  # the file keeps the key
    assert hooks["previous_secrets"] == [{"secret": "old-s3cret", "until": "2026-11-30T12:00:00Z"}]
    assert hooks["webhooks"][0]["headers"] == {"Authorization": "Bearer abc"}
    assert config_data(TABLE)["sources"][1]["write_keys"] == ["wk_live_1"]


def test_an_empty_table_is_an_empty_file() -> None:
    assert config_data(ConfigTable.build((), ())) == {"sources": [], "destinations": []}


@settings(max_examples=300, deadline=None)
@given(config_tables())
def test_any_table_comes_back_equal(table: ConfigTable) -> None:
    assert rebuilt(config_data(table)) == table
