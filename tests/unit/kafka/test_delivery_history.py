"""Delivery records written before ``userId`` was added still decode (schemas/history)."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro

from pipeline.core.records import dead_letter_from_record, delivery_from_record
from pipeline.kafka.codec import MAGIC, Codec, _fingerprint, schema_dir

CODEC = Codec.default()
OLD = {
    "messageId": "m",
    "destinationId": "hooks",
    "sourceId": "web",
    "callType": "track",
    "body": b'{"userId":"u1"}',
    "receivedAt": 1,
    "firstAttemptAt": None,
    "deadline": None,
    "notBefore": 0,
    "tier": 0,
    "replays": 0,
    "attempts": [],
}


def written_with(history_file: str, record: dict[str, Any]) -> bytes:
    schema = fastavro.parse_schema(
        json.loads((schema_dir() / "history" / history_file).read_text())
    )
    out = io.BytesIO()
    out.write(MAGIC + _fingerprint(schema))
    fastavro.schemaless_writer(out, schema, record)
    return out.getvalue()


def test_an_old_delivery_decodes_with_its_user_unknown() -> None:
    delivery = delivery_from_record(CODEC.decode("Delivery", written_with("delivery.v1.avsc", OLD)))
    assert delivery.user_id is None and delivery.tier == 0  # the body names the user


def test_an_old_dead_letter_keeps_its_delivery() -> None:
    letter = {
        "id": "x",
        "reason": "client_error",
        "detail": "",
        "deadLetteredAt": 1,
        "sourceTopic": "t",
        "sourcePartition": 0,
        "sourceOffset": 1,
        "delivery": OLD,
        "raw": None,
    }
    decoded = CODEC.decode("DeadLetter", written_with("dead_letter.v1.avsc", letter))
    delivery = dead_letter_from_record(decoded).delivery
    assert delivery is not None and delivery.message_id == "m" and delivery.user_id is None
