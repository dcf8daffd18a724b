"""Unit tests for pipeline.kafka.config_store: a Destination survives its trip through Avro, with
who wrote it; an apply plan names the changes made outside apply that it would overwrite."""

from __future__ import annotations

import copy
import io
import json

import fastavro
import fastavro.schema
import pytest

from pipeline.core.config import (
    Batch,
    ConfigTable,
    Destination,
    Ordering,
    PipelineConfig,
    RetryPolicy,
    Source,
    Webhook,
)
from pipeline.core.settings import Settings
from pipeline.core.timestamps import now_ms
from pipeline.kafka.codec import MAGIC, Codec, schema_dir
from pipeline.kafka.config_store import (
    Origin,
    _decode_destination,
    _encode_destination,
    _origin,
    _plan,
    destination_record,
    write_config,
)

APPLIED = Origin("apply", 1_795_470_065_000)


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec.default()


def through_kafka(codec: Codec, dest: Destination) -> Destination:
    encoded = codec.encode("Destination", _encode_destination(dest, APPLIED))
    return _decode_destination(codec.decode("Destination", encoded))


FULL = Destination(
    id="hooks",
    name="Webhooks",
    enabled=True,
    sources=["web", "ios"],
    shared_secret="s3cret",
    standard_webhooks=True,
    rate_limit=50.0,
    retry=RetryPolicy(delays=[10.0, 60.0, 300.0, 1800.0, 3600.0], deadline=4 * 3600.0),
    max_in_flight=200,
    disable_after=86_400.0,
    ordering=Ordering.PER_USER,
    webhooks=[Webhook(url="https://example.com/h", headers={"Authorization": "Bearer abc"})],
    disabled_reason="every attempt failed for 24h",
    disabled_at=1_795_273_500_000,
)


def test_a_destination_with_every_policy_field_round_trips(codec: Codec) -> None:
    assert through_kafka(codec, FULL) == FULL


def test_a_destination_without_a_policy_round_trips(codec: Codec) -> None:
    plain = Destination(id="d", sources=["web"], webhooks=[Webhook(url="https://example.com/")])
    assert through_kafka(codec, plain) == plain
    assert through_kafka(codec, plain).retry is None


@pytest.mark.parametrize(
    "retry",
    [RetryPolicy(delays=[1.5, 7 * 86_400.0]), RetryPolicy(deadline=60.0)],
    ids=["delays-only", "deadline-only"],
)
def test_a_partial_retry_policy_round_trips(codec: Codec, retry: RetryPolicy) -> None:
    dest = FULL.model_copy(update={"retry": retry})
    assert through_kafka(codec, dest) == dest


def test_a_v2_record_decodes_to_a_destination_without_a_policy(codec: Codec) -> None:
    v2 = fastavro.parse_schema(
        json.loads((schema_dir() / "history" / "destination.v2.avsc").read_text())
    )
    record = {
        "id": "hooks",
        "name": "Webhooks",
        "enabled": False,
        "sources": ["web"],
        "sharedSecret": None,
        "standardWebhooks": False,
        "rateLimit": 25.0,
        "webhooks": [{"url": "https://example.com/h", "headers": {}}],
    }
    canonical = fastavro.schema.to_parsing_canonical_form(copy.deepcopy(v2))
    out = io.BytesIO()
    out.write(MAGIC + bytes.fromhex(fastavro.schema.fingerprint(canonical, "CRC-64-AVRO")))
    fastavro.schemaless_writer(out, v2, record)
    dest = _decode_destination(codec.decode("Destination", out.getvalue()))
    assert (dest.id, dest.enabled, dest.rate_limit) == ("hooks", False, 25.0)
    assert dest.retry is None
    assert dest.max_in_flight is None
    assert dest.disable_after is None
    assert dest.disabled_reason is None
    assert dest.disabled_at is None
    assert dest.ordering is Ordering.NONE


def test_a_per_user_ordering_round_trips(codec: Codec) -> None:
    ordered = through_kafka(codec, FULL)
    assert (ordered.ordering, ordered.ordered) == (Ordering.PER_USER, True)
    plain = through_kafka(codec, FULL.model_copy(update={"ordering": Ordering.NONE}))
    assert (plain.ordering, plain.ordered) == (Ordering.NONE, False)
    assert _encode_destination(FULL, APPLIED)["ordering"] == "per_user"


def test_a_batch_round_trips(codec: Codec) -> None:
    batched = FULL.model_copy(
        update={
            "ordering": Ordering.NONE,
            "batch": Batch(max_events=50, max_bytes="64KiB", max_wait="250ms"),
        }
    )
    back = through_kafka(codec, batched)
    assert back == batched
    assert back.batch is not None
    assert (back.batch.max_events, back.batch.max_bytes, back.batch.max_wait) == (50, 65536, 0.25)
    assert through_kafka(codec, FULL).batch is None


def test_a_v4_record_written_before_ordering_reads_as_none(codec: Codec) -> None:
    v4 = fastavro.parse_schema(
        json.loads((schema_dir() / "history" / "destination.v4.avsc").read_text())
    )
    record = {k: v for k, v in _encode_destination(FULL, APPLIED).items() if k != "ordering"}
    canonical = fastavro.schema.to_parsing_canonical_form(copy.deepcopy(v4))
    out = io.BytesIO()
    out.write(MAGIC + bytes.fromhex(fastavro.schema.fingerprint(canonical, "CRC-64-AVRO")))
    fastavro.schemaless_writer(out, v4, record)
    dest = _decode_destination(codec.decode("Destination", out.getvalue()))
    assert dest == FULL.model_copy(update={"ordering": Ordering.NONE})
    assert dest.ordered is False


def test_who_wrote_a_record_and_when_round_trips(codec: Codec) -> None:
    console = Origin("console:ab12", 1_795_470_065_000)
    encoded = codec.encode("Destination", _encode_destination(FULL, console))
    record = codec.decode("Destination", encoded)
    assert _origin(record) == console
    assert _decode_destination(record) == FULL  # the models do not carry it


@pytest.mark.parametrize(
    ("origin", "outside"),
    [
        (Origin("apply", 1), False),
        (Origin(None, None), False),
        (Origin("console:ab12", 1), True),
        (Origin("pipeline", 1), True),
    ],
)
def test_only_a_writer_other_than_apply_counts_as_outside_apply(
    origin: Origin, outside: bool
) -> None:
    assert origin.outside_apply is outside


SOURCE = Source(id="web", write_keys=["wk"])
PLAIN = Destination(id="plain", sources=["web"], webhooks=[Webhook(url="https://example.org/")])
CURRENT = ConfigTable.build([SOURCE], [FULL, PLAIN])
CONSOLE = Origin("console:ab12", 1_795_470_065_000)


def test_the_plan_names_the_changes_made_outside_apply_that_it_overwrites() -> None:
    origins = {
        "source:web": APPLIED,
        "destination:hooks": CONSOLE,
        "destination:plain": Origin("pipeline", 1_795_470_000_000),
    }
    toggled = FULL.model_copy(update={"enabled": False})
    plan = _plan(
        CURRENT, origins, PipelineConfig(sources=[SOURCE], destinations=[toggled]), prune=True
    )
    assert (plan.updated, plan.deleted, plan.unchanged) == (
        ["destination:hooks"],
        ["destination:plain"],
        ["source:web"],
    )
    assert plan.overwrites == {
        "destination:hooks": CONSOLE,
        "destination:plain": Origin("pipeline", 1_795_470_000_000),
    }
    assert plan.writes == [("destination:hooks", toggled), ("destination:plain", None)]


def test_leaving_a_console_change_as_it_is_overwrites_nothing() -> None:
    origins = {"source:web": CONSOLE, "destination:hooks": CONSOLE, "destination:plain": CONSOLE}
    config = PipelineConfig(sources=[SOURCE.model_copy()], destinations=[FULL, PLAIN])
    plan = _plan(CURRENT, origins, config, prune=True)
    assert plan.unchanged == ["source:web", "destination:hooks", "destination:plain"]
    assert (plan.overwrites, plan.writes) == ({}, [])


def test_records_from_apply_or_from_before_origins_were_kept_are_overwritten_silently() -> None:
    origins = {"source:web": Origin(None, None), "destination:hooks": APPLIED}
    config = PipelineConfig(
        sources=[SOURCE.model_copy(update={"name": "Website"})],
        destinations=[FULL.model_copy(update={"enabled": False})],
    )
    plan = _plan(CURRENT, origins, config, prune=False)
    assert plan.updated == ["source:web", "destination:hooks"]
    assert plan.overwrites == {}


@pytest.mark.parametrize("changed_by", ["", "apply"])
def test_write_config_refuses_to_pass_for_config_apply(changed_by: str) -> None:
    with pytest.raises(ValueError, match="changed_by: .* is reserved for config apply"):
        write_config(Settings(), [SOURCE], changed_by=changed_by)


def test_the_pipelines_own_change_is_stamped_as_the_pipelines(codec: Codec) -> None:
    before = now_ms()
    topic, key, value = destination_record("config", codec, FULL)
    origin = _origin(codec.decode("Destination", value))
    assert (topic, key, origin.changed_by) == ("config", b"destination:hooks", "pipeline")
    assert origin.changed_at is not None and before <= origin.changed_at <= now_ms()
