"""Unit tests for pipeline.kafka.codec: Avro single-object encoding and schema evolution."""

from __future__ import annotations

import copy
import io
import json
from typing import Any

import fastavro
import fastavro.schema
import pytest

from pipeline import UndecodableRecord, parse_call
from pipeline.core.records import call_from_record, call_to_record, new_delivery
from pipeline.core.render import render_body
from pipeline.kafka.codec import MAGIC, Codec, schema_dir

# ---- an independent CRC-64-AVRO (Rabin) fingerprint, as the Avro spec gives it ---------------------

_EMPTY = 0xC15D213AA4D7A795
_TABLE = []
for _i in range(256):
    _fp = _i
    for _ in range(8):
        _fp = (_fp >> 1) ^ (_EMPTY & -(_fp & 1))
    _TABLE.append(_fp)


def rabin(data: bytes) -> int:
    fp = _EMPTY
    for byte in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return fp


def header_for(schema: dict[str, Any]) -> bytes:
    canonical = fastavro.schema.to_parsing_canonical_form(
        fastavro.parse_schema(copy.deepcopy(schema))
    )
    return b"\xc3\x01" + rabin(canonical.encode()).to_bytes(8, "little")


SOURCE_CANONICAL = (
    '{"name":"pipeline.config.Source","type":"record","fields":[{"name":"id","type":"string"},'
    '{"name":"name","type":"string"},{"name":"writeKeys","type":{"type":"array","items":"string"}},'
    '{"name":"blockedEvents","type":{"type":"array","items":"string"}},'
    '{"name":"changedBy","type":["null","string"]},{"name":"changedAt","type":["null","long"]}]}'
)


def schema_json(stem: str) -> dict[str, Any]:
    return json.loads((schema_dir() / f"{stem}.avsc").read_text())


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec.default()


def test_rabin_matches_the_avro_spec_test_vector() -> None:
    # Avro's own test suite: the 64-bit Rabin fingerprint of the schema "null"
    assert rabin(b'"null"') == 7195948357588979594


def test_single_object_header(codec: Codec) -> None:
    data = codec.encode("Source", {"id": "web", "name": "Website"})
    assert MAGIC == b"\xc3\x01"
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == rabin(SOURCE_CANONICAL.encode()).to_bytes(8, "little")
    # the body is plain Avro binary of the schema
    body = fastavro.schemaless_reader(io.BytesIO(data[10:]), codec.schema("Source"), None)
    assert body == {
        "id": "web",
        "name": "Website",
        "writeKeys": [],
        "blockedEvents": [],
        "changedBy": None,
        "changedAt": None,
    }


@pytest.mark.parametrize("name", ["Call", "Delivery", "DeadLetter", "Source", "Destination"])
def test_every_record_has_a_header_of_its_own_schema(codec: Codec, name: str) -> None:
    stems = {
        "Call": "call",
        "Delivery": "delivery",
        "DeadLetter": "dead_letter",
        "Source": "source",
        "Destination": "destination",
    }
    canonical = fastavro.schema.to_parsing_canonical_form(codec.schema(name))
    expected = b"\xc3\x01" + rabin(canonical.encode()).to_bytes(8, "little")
    assert codec.schema(name)["name"].endswith(name)
    assert json.loads(canonical)["name"] == schema_json(stems[name])["namespace"] + "." + name
    assert codec.encode(name, RECORDS[name])[:10] == expected


# ---- round trips -----------------------------------------------------------------------------------

CALL = parse_call(
    {
        "type": "track",
        "userId": "u1",
        "anonymousId": "a1",
        "messageId": "m1",
        "event": "Bestellung ✓",
        "properties": {"a": 1},
        "context": {"ip": "1.2.3.4"},
        "integrations": {"All": False, "Webhooks": True},
        "timestamp": "2026-11-21T07:04:30.123Z",
        "sentAt": "2026-11-21T07:04:31.000Z",
    },
    source_id="web",
    received_at=1_795_273_480_000,
)
DELIVERY = {
    **new_delivery(CALL, "hooks-1", render_body(CALL)),
    "firstAttemptAt": 1_795_273_480_100,
    "deadline": 1_795_287_880_100,
    "notBefore": 1_795_273_490_100,
    "tier": 0,
    "replays": 1,
    "attempts": [
        {
            "at": 1_795_273_480_100,
            "url": "https://a/h",
            "status": 503,
            "error": None,
            "durationMs": 12,
        },
        {
            "at": 1_795_273_480_100,
            "url": "https://b/h",
            "status": None,
            "error": "timeout",
            "durationMs": 5000,
        },
    ],
}
RECORDS: dict[str, dict[str, Any]] = {
    "Call": call_to_record(CALL),
    "Delivery": DELIVERY,
    "DeadLetter": {
        "id": "dl-1",
        "reason": "client_error",
        "detail": "404 Not Found",
        "deadLetteredAt": 1_795_273_500_000,
        "sourceTopic": "deliveries.webhooks",
        "sourcePartition": 2,
        "sourceOffset": 12345,
        "delivery": DELIVERY,
        "raw": None,
    },
    "Source": {
        "id": "web",
        "name": "Website",
        "writeKeys": ["wk1"],
        "blockedEvents": ["Debug"],
        "changedBy": "apply",
        "changedAt": 1_795_470_065_000,
    },
    "Destination": {
        "id": "hooks-1",
        "name": "Webhooks",
        "enabled": True,
        "sources": ["web", "ios"],
        "sharedSecret": "s3cret",
        "standardWebhooks": True,
        "rateLimit": 25.0,
        "webhooks": [
            {"url": "https://example.com/hook", "headers": {"Authorization": "Bearer abc"}},
            {"url": "http://127.0.0.1:8090/x", "headers": {}},
        ],
        "retryDelays": [10.0, 60.0, 300.0],
        "retryDeadline": 14400.0,
        "maxInFlight": 200,
        "disableAfter": 86400.0,
        "disabledReason": "every attempt failed for 24h",
        "disabledAt": 1_795_273_500_000,
        "changedBy": "console:ab12",
        "changedAt": 1_795_470_065_000,
        "ordering": "per_user",
        "batch": {"maxEvents": 100, "maxBytes": 500_000, "maxWait": 1.0},
        "previousSecrets": [{"secret": "old-s3cret", "until": 1_795_600_000_000}],
        "signing": "ed25519",
        "signingKey": "whsk_" + "A" * 43 + "=",
        "mtls": {"certificate": "/etc/pipeline/client.pem", "key": "/etc/k.pem", "ca": None},
        "proxy": "http://proxy.internal:3128",
        "oauth2": {
            "tokenUrl": "https://auth.example.com/token",
            "clientId": "id",
            "clientSecret": "s",
            "scope": None,
        },
        "traceContext": False,
    },
}

#: Source and Destination fields added after schemas/history/source.v1.avsc and
#: destination.v3.avsc (who wrote the record, and when), with their defaults.
ORIGIN_DEFAULTS = {"changedBy": None, "changedAt": None}

#: The Destination fields each shipped schema lacks, by the last schema without them (oldest
#: first), with their defaults.
ADDED_AFTER: list[tuple[str, dict[str, Any]]] = [
    ("destination.v4", {"ordering": "none"}),
    ("destination.v5", {"batch": None}),
    ("destination.v6", {"previousSecrets": []}),
    ("destination.v7", {"signing": None, "signingKey": None}),
    ("destination.v8", {"mtls": None}),
    ("destination.v9", {"proxy": None}),
    ("destination.v10", {"oauth2": None}),
    ("destination.v11", {"traceContext": True}),
]


def added_since(shipped: str) -> dict[str, Any]:
    """Every Destination field added after schemas/history/``shipped``.avsc (one of
    ``ADDED_AFTER``), with its default."""
    names = [name for name, _ in ADDED_AFTER]
    return {k: v for _, fields in ADDED_AFTER[names.index(shipped) :] for k, v in fields.items()}


#: Every Destination field added after the schemas before ``ADDED_AFTER``'s (v1 to v3).
LATER_DEFAULTS = added_since("destination.v4")

#: Destination fields added after schemas/history/destination.v2.avsc, with their defaults.
DESTINATION_V3_DEFAULTS = {
    "retryDelays": None,
    "retryDeadline": None,
    "maxInFlight": None,
    "disableAfter": None,
    "disabledReason": None,
    "disabledAt": None,
}


def test_a_destination_written_with_the_shipped_v1_schema_still_decodes(codec: Codec) -> None:
    """schemas/history/destination.v1.avsc predates standardWebhooks and rateLimit."""
    import io

    import fastavro

    from pipeline.kafka.codec import MAGIC, _fingerprint, schema_dir

    old = fastavro.parse_schema(
        json.loads((schema_dir() / "history" / "destination.v1.avsc").read_text())
    )
    record = {
        k: v
        for k, v in RECORDS["Destination"].items()
        if k
        not in (
            "standardWebhooks",
            "rateLimit",
            *DESTINATION_V3_DEFAULTS,
            *ORIGIN_DEFAULTS,
            *LATER_DEFAULTS,
        )
    }
    out = io.BytesIO()
    out.write(MAGIC + _fingerprint(old))
    fastavro.schemaless_writer(out, old, record)
    decoded = codec.decode("Destination", out.getvalue())
    assert decoded == {
        **record,
        "standardWebhooks": False,
        "rateLimit": None,
        **DESTINATION_V3_DEFAULTS,
        **ORIGIN_DEFAULTS,
        **LATER_DEFAULTS,
    }


def test_a_destination_written_with_the_shipped_v2_schema_decodes_with_policy_defaults(
    codec: Codec,
) -> None:
    """schemas/history/destination.v2.avsc predates the delivery policy (retry, max_in_flight,
    disable_after) and the auto-disable state."""
    old = json.loads((schema_dir() / "history" / "destination.v2.avsc").read_text())
    assert {f["name"] for f in old["fields"]}.isdisjoint(DESTINATION_V3_DEFAULTS)
    record = {
        k: v
        for k, v in RECORDS["Destination"].items()
        if k
        not in (
            *DESTINATION_V3_DEFAULTS,
            *ORIGIN_DEFAULTS,
            *LATER_DEFAULTS,
        )
    }
    decoded = codec.decode("Destination", write_with(old, record))
    assert decoded == {
        **record,
        **DESTINATION_V3_DEFAULTS,
        **ORIGIN_DEFAULTS,
        **LATER_DEFAULTS,
    }


@pytest.mark.parametrize(
    ("name", "shipped"), [("Source", "source.v1"), ("Destination", "destination.v3")]
)
def test_a_config_record_written_before_origins_decodes_without_one(
    codec: Codec, name: str, shipped: str
) -> None:
    """schemas/history/source.v1.avsc and destination.v3.avsc predate changedBy and changedAt."""
    old = json.loads((schema_dir() / "history" / f"{shipped}.avsc").read_text())
    assert {f["name"] for f in old["fields"]}.isdisjoint(ORIGIN_DEFAULTS)
    later = {
        **ORIGIN_DEFAULTS,
        **(LATER_DEFAULTS if name == "Destination" else {}),
    }
    record = {k: v for k, v in RECORDS[name].items() if k not in later}
    assert codec.decode(name, write_with(old, record)) == {**record, **later}


@pytest.mark.parametrize(
    ("shipped", "added"), ADDED_AFTER, ids=[shipped for shipped, _ in ADDED_AFTER]
)
def test_a_destination_written_with_a_shipped_schema_decodes_with_the_later_defaults(
    codec: Codec, shipped: str, added: dict[str, Any]
) -> None:
    """schemas/history/destination.v4 to v10: each predates the fields added after it (v4
    ordering: none; v5 batch: one call a request; v6 previousSecrets: none rotating; v7 signing:
    HMAC only; v8 mtls: the system's trust store; v9 proxy: PIPELINE_HTTP_PROXY, if any; v10
    oauth2: no bearer token)."""
    old = json.loads((schema_dir() / "history" / f"{shipped}.avsc").read_text())
    assert {f["name"] for f in old["fields"]}.isdisjoint(added)
    later = added_since(shipped)
    record = {k: v for k, v in RECORDS["Destination"].items() if k not in later}
    decoded = codec.decode("Destination", write_with(old, record))
    assert decoded == {**record, **later}


@pytest.mark.parametrize("name", list(RECORDS))
def test_round_trip(codec: Codec, name: str) -> None:
    assert codec.decode(name, codec.encode(name, RECORDS[name])) == RECORDS[name]


def test_call_round_trip_through_records(codec: Codec) -> None:
    decoded = call_from_record(codec.decode("Call", codec.encode("Call", call_to_record(CALL))))
    assert decoded == CALL
    assert render_body(decoded) == render_body(CALL)


def test_dead_letter_of_an_undecodable_record_keeps_raw_bytes(codec: Codec) -> None:
    record = {**RECORDS["DeadLetter"], "delivery": None, "raw": b"\x00\xffgarbage"}
    assert codec.decode("DeadLetter", codec.encode("DeadLetter", record)) == record


def test_body_bytes_survive_exactly(codec: Codec) -> None:
    body = render_body(CALL)
    decoded = codec.decode("Delivery", codec.encode("Delivery", DELIVERY))
    assert decoded["body"] == body
    assert isinstance(decoded["body"], bytes)


def test_defaults_fill_optional_fields(codec: Codec) -> None:
    minimal = {
        "messageId": "m",
        "destinationId": "d",
        "sourceId": "s",
        "callType": "track",
        "body": b"{}",
        "receivedAt": 1,
    }
    decoded = codec.decode("Delivery", codec.encode("Delivery", minimal))
    assert decoded["firstAttemptAt"] is None
    assert decoded["deadline"] is None
    assert decoded["notBefore"] == 0
    assert decoded["tier"] == -1
    assert decoded["replays"] == 0
    assert decoded["attempts"] == []


def test_encode_rejects_a_record_that_breaks_the_schema(codec: Codec) -> None:
    with pytest.raises((ValueError, TypeError)):
        codec.encode("Source", {"id": 5, "name": "x"})


# ---- schema evolution ------------------------------------------------------------------------------


def write_with(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    out.write(header_for(schema))
    fastavro.schemaless_writer(out, fastavro.parse_schema(copy.deepcopy(schema)), record)
    return out.getvalue()


def test_an_older_call_schema_still_decodes_with_defaults() -> None:
    codec = Codec(schema_dir())
    old = schema_json("call")
    dropped = {"sentAt", "category", "integrations", "context"}
    old["fields"] = [f for f in old["fields"] if f["name"] not in dropped]
    old_record = {
        "type": "identify",
        "messageId": "m-old",
        "sourceId": "web",
        "timestamp": 1000,
        "receivedAt": 2000,
        "userId": "u-old",
        "anonymousId": None,
        "event": None,
        "name": None,
        "groupId": None,
        "previousId": None,
        "properties": None,
        "traits": '{"plan":"pro"}',
    }
    data = write_with(old, old_record)

    # before the old schema is known, its fingerprint is unknown
    with pytest.raises(UndecodableRecord, match="unknown writer schema fingerprint"):
        codec.decode("Call", data)

    codec.add_writer_schema(old)
    decoded = codec.decode("Call", data)
    assert decoded == {
        **old_record,
        "sentAt": None,
        "category": None,
        "integrations": None,
        "context": None,
    }
    call = call_from_record(decoded)
    assert call.user_id == "u-old" and call.traits == '{"plan":"pro"}'
    # current records still decode as before
    assert codec.decode("Call", codec.encode("Call", RECORDS["Call"])) == RECORDS["Call"]


def test_an_older_delivery_schema_still_decodes_with_defaults() -> None:
    codec = Codec(schema_dir())
    old = schema_json("delivery")
    old["fields"] = [f for f in old["fields"] if f["name"] not in ("replays", "notBefore")]
    record = {k: v for k, v in DELIVERY.items() if k not in ("replays", "notBefore")}
    codec.add_writer_schema(old)
    decoded = codec.decode("Delivery", write_with(old, record))
    assert decoded == {**record, "replays": 0, "notBefore": 0}


def test_an_older_source_schema_still_decodes() -> None:
    codec = Codec(schema_dir())
    old = schema_json("source")
    old["fields"] = [f for f in old["fields"] if f["name"] != "blockedEvents"]
    codec.add_writer_schema(old)
    decoded = codec.decode(
        "Source", write_with(old, {"id": "web", "name": "W", "writeKeys": ["k"]})
    )
    assert decoded == {
        "id": "web",
        "name": "W",
        "writeKeys": ["k"],
        "blockedEvents": [],
        **ORIGIN_DEFAULTS,
    }


# ---- undecodable input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        None,
        b"",
        b"\xc3",
        b"\xc3\x01",
        b"\xc3\x01\x00\x00\x00",  # shorter than the header
        b"hello, world, this is not avro",
        b'{"type":"track"}',
        b"\x00" * 40,
        b"\x01\xc3" + bytes(8) + b"\x00",  # magic bytes swapped
        b"\xc3\x02" + bytes(20),  # wrong format version
    ],
)
def test_garbage_is_undecodable(codec: Codec, data: bytes | None) -> None:
    with pytest.raises(UndecodableRecord):
        codec.decode("Call", data)


def test_wrong_magic_on_a_valid_body(codec: Codec) -> None:
    data = codec.encode("Source", RECORDS["Source"])
    with pytest.raises(UndecodableRecord, match="C3 01"):
        codec.decode("Source", b"\x00\x00" + data[2:])


def test_unknown_fingerprint(codec: Codec) -> None:
    data = codec.encode("Source", RECORDS["Source"])
    forged = data[:2] + bytes(8) + data[10:]
    with pytest.raises(UndecodableRecord, match="0000000000000000"):
        codec.decode("Source", forged)


def test_every_truncation_of_a_body_is_undecodable(codec: Codec) -> None:
    for name in ("Call", "Delivery", "Destination"):
        data = codec.encode(name, RECORDS[name])
        for cut in range(len(data)):
            with pytest.raises(UndecodableRecord):
                codec.decode(name, data[:cut])


def test_corrupt_body(codec: Codec) -> None:
    data = bytearray(codec.encode("Call", RECORDS["Call"]))
    data[10] = 0x7F  # enum index 63: not a call type
    with pytest.raises(UndecodableRecord, match="corrupt Call"):
        codec.decode("Call", bytes(data))


def test_a_record_of_another_schema_is_undecodable(codec: Codec) -> None:
    with pytest.raises(UndecodableRecord):
        codec.decode("Call", codec.encode("Source", RECORDS["Source"]))


def test_default_codec_is_shared() -> None:
    assert Codec.default() is Codec.default()


@pytest.mark.parametrize("name", ["LogBatch", "LogRecord"])
def test_the_delivery_log_written_before_trace_ids_still_decodes(codec: Codec, name: str) -> None:
    """schemas/history/log_batch.v1.avsc and log_record.v1.avsc predate an entry's traceId."""
    import io

    import fastavro

    from pipeline.core.log_entries import LogKind, entry, log_record
    from pipeline.kafka.codec import MAGIC, _fingerprint, schema_dir
    from pipeline.kafka.log_reading import decode_log_records

    stem = "log_batch.v1" if name == "LogBatch" else "log_record.v1"
    old = fastavro.parse_schema(json.loads((schema_dir() / "history" / f"{stem}.avsc").read_text()))
    received = entry(LogKind.RECEIVED, 5, size=10)
    del received["traceId"]
    record = log_record("m1", "web", "track", [received])
    out = io.BytesIO()
    out.write(MAGIC + _fingerprint(old))
    fastavro.schemaless_writer(out, old, {"records": [record]} if name == "LogBatch" else record)
    (decoded,) = decode_log_records(codec, out.getvalue())
    assert decoded["entries"] == [{**received, "traceId": ""}]
