"""Unit tests for pipeline.kafka.config_store: a Destination survives its trip through Avro."""

from __future__ import annotations

import copy
import io
import json

import fastavro
import fastavro.schema
import pytest

from pipeline.core.config import Destination, RetryPolicy, Webhook
from pipeline.kafka.codec import MAGIC, Codec, schema_dir
from pipeline.kafka.config_store import _decode_destination, _encode_destination


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec.default()


def through_kafka(codec: Codec, dest: Destination) -> Destination:
    return _decode_destination(
        codec.decode("Destination", codec.encode("Destination", _encode_destination(dest)))
    )


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
